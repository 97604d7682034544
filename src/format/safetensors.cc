// safetensors files on disk: mmap'd reading of one file, model directories (single file, indexed
// shards, or a bare set of shards) and atomic writing. Header validation lives in
// safetensors_parse.cc; this file only adds the file system.
#include "format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "format/quote.h"
#include "format/safetensors_parse.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFileName = "model.safetensors";
constexpr const char* kIndexFileName = "model.safetensors.index.json";

// Closes a POSIX file descriptor on every path out of a scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { close(); }
  int get() const { return fd_; }
  int close() {
    const int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

// ---- SafetensorsFile ----

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  const std::string source = path.string();
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  check(fd.get() >= 0, source, ": cannot open: ", errno_text());
  struct stat st {};
  check(::fstat(fd.get(), &st) == 0, source, ": cannot stat: ", errno_text());
  check(S_ISREG(st.st_mode), source, ": not a regular file");
  const auto size = static_cast<std::size_t>(st.st_size);

  auto file = std::make_shared<SafetensorsFile>();
  file->path_ = path;
  std::span<const std::byte> image;
  if (size > 0) {  // mmap refuses length 0; the parser reports the empty file
    void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    check(addr != MAP_FAILED, source, ": cannot mmap ", size, " bytes: ", errno_text());
    file->mapping_ = std::shared_ptr<void>(addr, [size](void* p) { ::munmap(p, size); });
    image = {static_cast<const std::byte*>(addr), size};
  }
  SafetensorsLayout layout = parse_safetensors_image(image, source);
  file->data_ = image.data() + layout.data_offset;
  file->tensors_ = std::move(layout.tensors);
  file->metadata_ = std::move(layout.metadata);
  for (std::size_t i = 0; i < file->tensors_.size(); ++i) file->index_[file->tensors_[i].name] = i;
  return file;
}

bool SafetensorsFile::contains(const std::string& name) const {
  return index_.count(name) > 0;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  check(it != index_.end(), path_.string(), ": tensor ", quote_text(name), " not found");
  return tensors_[it->second];
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& t = info(name);
  // The mapping is read-only: a write through this view faults. Convert into a new tensor instead.
  auto* data = const_cast<std::byte*>(data_ + t.begin);
  return Tensor::wrap(data, t.dtype, t.shape, Device::kCpu, mapping_);
}

// ---- Checkpoint ----

namespace {

// weight_map of model.safetensors.index.json: tensor name -> shard file name.
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const std::string source = index_path.string();
  std::ifstream in(index_path, std::ios::binary);
  check(in.good(), source, ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  json root;
  try {
    root = json::parse(text.str());
  } catch (const json::exception& e) {
    fail(source, ": not valid JSON: ", printable(e.what()));
  }
  check(root.is_object(), source, ": must be a JSON object, got ", root.type_name());
  const auto it = root.find("weight_map");
  check(it != root.end(), source, ": missing \"weight_map\"");
  check(it->is_object(), source, ": \"weight_map\" must be an object of strings, got ",
        it->type_name());
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : it->items()) {
    check(shard.is_string(), source, ": weight_map[", quote_text(name),
          "] must be a shard file name, got ", shard.type_name());
    const auto& file = shard.get_ref<const std::string&>();
    // A shard is a plain file name: the index must not reach outside the model directory.
    const fs::path shard_path(file);
    check(!file.empty() && file != "." && file != ".." && shard_path.filename() == shard_path,
          source, ": weight_map[", quote_text(name), "] = ", quote_text(file),
          " is not a file name");
    weight_map.emplace(name, file);
  }
  return weight_map;
}

std::vector<fs::path> all_safetensors_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& dir) {
  const std::string where = dir.string();
  std::error_code error;
  check(fs::exists(dir, error), "model directory ", where, " does not exist");
  check(fs::is_directory(dir, error), "model directory ", where, " is not a directory");

  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  std::vector<fs::path> shards;
  std::map<std::string, std::string> weight_map;
  const fs::path index_path = dir / kIndexFileName;
  if (fs::is_regular_file(dir / kSingleFileName, error)) {  // transformers looks here first too
    shards.push_back(dir / kSingleFileName);
  } else if (fs::exists(index_path, error)) {
    weight_map = read_weight_map(index_path);
    std::set<std::string> names;
    for (const auto& [tensor, shard] : weight_map) {
      if (!names.insert(shard).second) continue;
      check(fs::is_regular_file(dir / shard, error), index_path.string(), ": shard ",
            quote_text(shard), " (holding tensor ", quote_text(tensor), ") not found in ", where);
    }
    for (const auto& shard : names) shards.push_back(dir / shard);
  } else {
    shards = all_safetensors_files(dir);
  }
  check(!shards.empty(), where, ": no .safetensors files found (expected ", kSingleFileName, " or ",
        kIndexFileName, ")");

  for (const auto& shard : shards) {
    checkpoint.files_.push_back(SafetensorsFile::open(shard));
    const std::size_t file_index = checkpoint.files_.size() - 1;
    for (const auto& t : checkpoint.files_.back()->tensors()) {
      const auto [it, inserted] = checkpoint.owner_.emplace(t.name, file_index);
      check(inserted, where, ": tensor ", quote_text(t.name), " is in both ",
            quote_text(checkpoint.files_[it->second]->path().filename().string()), " and ",
            quote_text(shard.filename().string()));
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    const auto it = checkpoint.owner_.find(tensor);
    check(it != checkpoint.owner_.end() &&
              checkpoint.files_[it->second]->path().filename() == fs::path(shard),
          index_path.string(), ": tensor ", quote_text(tensor), " is listed in shard ",
          quote_text(shard), " but is not there");
  }
  return checkpoint;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  names.reserve(owner_.size());
  for (const auto& [name, file] : owner_) names.push_back(name);
  return names;
}

bool Checkpoint::contains(const std::string& name) const {
  return owner_.count(name) > 0;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  const auto it = owner_.find(name);
  check(it != owner_.end(), dir_.string(), ": tensor ", quote_text(name),
        " not found in checkpoint");
  return files_[it->second]->info(name);
}

Tensor Checkpoint::get(const std::string& name) const {
  const auto it = owner_.find(name);
  check(it != owner_.end(), dir_.string(), ": tensor ", quote_text(name),
        " not found in checkpoint");
  return files_[it->second]->get(name);
}

// ---- writing ----

namespace {

std::string header_text(const std::string& source,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in the caller's order, which is also the order of the data.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    check(name != "__metadata__", source, ": \"__metadata__\" is not a valid tensor name");
    check(names.insert(name).second, source, ": tensor ", quote_text(name), " given twice");
    check(tensor.device() == Device::kCpu, source, ": tensor ", quote_text(name), " is ",
          tensor.describe(), "; copy it to the CPU before writing");
    for (int64_t d : tensor.shape())
      check(d >= 0, source, ": tensor ", quote_text(name), " has shape ",
            shape_str(tensor.shape()));
    check(tensor.defined() || tensor.numel() == 0, source, ": tensor ", quote_text(name),
          " has no data");
    const uint64_t end = offset + tensor.nbytes();
    header[name] = {{"dtype", std::string(dtype_name(tensor.dtype()))},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    fail(source, ": tensor names and metadata must be valid UTF-8");
  }
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void write_all(int fd, const void* data, std::size_t size, const std::string& source) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    check(n > 0, source, ": write failed: ", errno_text());
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

void write_safetensors(const fs::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string source = path.string();
  const std::string header = header_text(source, tensors, metadata);

  // Write beside the target and rename over it: a failure leaves any previous file intact.
  const fs::path temp = fs::path(source + ".tmp-" + std::to_string(::getpid()));
  FileDescriptor fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  check(fd.get() >= 0, temp.string(), ": cannot create: ", errno_text());
  try {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));
    write_all(fd.get(), length, sizeof length, source);
    write_all(fd.get(), header.data(), header.size(), source);
    for (const auto& [name, tensor] : tensors)
      if (tensor.nbytes() > 0) write_all(fd.get(), tensor.raw(), tensor.nbytes(), source);
    check(::fsync(fd.get()) == 0, source, ": fsync failed: ", errno_text());
    check(fd.close() == 0, source, ": close failed: ", errno_text());
    check(::rename(temp.c_str(), path.c_str()) == 0, source, ": cannot rename ", temp.string(),
          " over it: ", errno_text());
  } catch (...) {
    fd.close();
    ::unlink(temp.c_str());
    throw;
  }
}

}  // namespace nibble
