// .npy reader and writer.
#include "core/npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <string>

namespace nibble {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "<f4";
    case DType::kI32: return "<i4";
    default: fail("write_npy: dtype ", dtype_name(dtype), " is not supported (F32, I32)");
  }
}

}  // namespace

void write_npy(const std::filesystem::path& path, const Tensor& tensor) {
  check(tensor.device() == Device::kCpu, "write_npy: tensor is not on the CPU");
  std::string shape;
  for (int i = 0; i < tensor.rank(); ++i) shape += (i ? ", " : "") + std::to_string(tensor.dim(i));
  if (tensor.rank() == 1) shape += ",";  // "(3,)", "(3, 4)"
  std::string header = cat("{'descr': '", descr_of(tensor.dtype()), "', 'fortran_order': False, 'shape': (",
                           shape, "), }");
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    check(out.good(), "cannot write ", tmp.string());
    out.write(kMagic, 6);
    out.put(1);
    out.put(0);
    const auto len = static_cast<uint16_t>(header.size());
    out.put(static_cast<char>(len & 0xFF));
    out.put(static_cast<char>(len >> 8));
    out << header;
    out.write(static_cast<const char*>(tensor.raw()), static_cast<std::streamsize>(tensor.nbytes()));
    check(out.good(), "error writing ", tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

Tensor read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), path.string(), ": cannot open");
  char magic[8] = {};
  in.read(magic, 8);
  check(in.good() && std::memcmp(magic, kMagic, 6) == 0 && magic[6] == 1, path.string(),
        ": not a version 1 .npy file");
  unsigned char len_bytes[2] = {};
  in.read(reinterpret_cast<char*>(len_bytes), 2);
  std::string header(len_bytes[0] | (len_bytes[1] << 8), '\0');
  in.read(header.data(), static_cast<std::streamsize>(header.size()));
  check(in.good(), path.string(), ": truncated header");
  std::smatch m;
  check(std::regex_search(header, m, std::regex("'descr': '([<|]?)(f4|i4)'")), path.string(),
        ": unsupported dtype in ", header);
  const DType dtype = m[2] == "f4" ? DType::kF32 : DType::kI32;
  check(header.find("'fortran_order': False") != std::string::npos, path.string(), ": Fortran order");
  check(std::regex_search(header, m, std::regex("'shape': \\(([0-9, ]*)\\)")), path.string(), ": no shape");
  Shape shape;
  const std::string dims = m[1];
  const std::regex number("[0-9]+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    shape.push_back(std::stoll(it->str()));
  Tensor t = Tensor::zeros(dtype, shape);
  in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  check(in.gcount() == static_cast<std::streamsize>(t.nbytes()), path.string(), ": truncated data");
  return t;
}

}  // namespace nibble
