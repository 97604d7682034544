// One GPU per tensor-parallel rank: device selection, CudaOps and NCCL communicators per rank
// thread.
#include "cuda/tp_device_group.h"

#include "cuda/cuda_check.h"
#include "cuda/cuda_ops.h"
#include "cuda/device.h"
#include "cuda/nccl_communicator.h"

namespace nibble::cuda {

void check_gpu_count(int tp_size) {
  const int visible = device_count();
  check(visible >= tp_size, "--tp-size ", tp_size, " needs ", tp_size, " GPUs, ", visible,
        " visible");
}

std::unique_ptr<TensorParallelModel> make_cuda_tp_model(const ModelConfig& whole, int tp_size,
                                                        Ops& rank0_ops,
                                                        const RankWeights& weights) {
  check_gpu_count(tp_size);
  check(rank0_ops.device() == Device::kCuda,
        "tensor parallel on CUDA: rank 0's backend is not CUDA");
  int device = -1;
  cuda_check(cudaGetDevice(&device));
  check(device == 0,
        "tensor parallel on CUDA: rank 0 must run on device 0, this thread is on device ", device);
  // Rank 0's work goes to its CudaOps' stream whichever thread runs the steps later (serve's engine
  // loop has a thread of its own); each peer's to its own thread's stream.
  const cudaStream_t rank0_stream = dynamic_cast<CudaOps&>(rank0_ops).stream();
  const auto stream_of = [rank0_stream](int rank) {
    return rank == 0 ? rank0_stream : compute_stream();
  };
  auto group = std::make_shared<NcclGroup>(tp_size);
  const TpSetup setup{
      .size = tp_size,
      .enter =
          [](int rank) {
            cuda_check(cudaSetDevice(rank));
            // Before each graph replay this rank copies the step's inputs from rank 0's tensors,
            // which come from device 0's stream-ordered pool: let this device access that pool
            // (peer to peer).
            int peer_access = 0;
            cuda_check(cudaDeviceCanAccessPeer(&peer_access, rank, 0));
            if (peer_access) {
              cudaMemPool_t pool = nullptr;
              cuda_check(cudaDeviceGetDefaultMemPool(&pool, 0));
              cudaMemAccessDesc access{};
              access.location.type = cudaMemLocationTypeDevice;
              access.location.id = rank;
              access.flags = cudaMemAccessFlagsProtReadWrite;
              cuda_check(cudaMemPoolSetAccess(pool, &access, 1));
            }
          },
      .make_ops = [](int) -> std::unique_ptr<Ops> { return std::make_unique<CudaOps>(); },
      .make_communicator = [group, stream_of](int rank) -> std::unique_ptr<Communicator> {
        return std::make_unique<NcclCommunicator>(group, rank, stream_of(rank));
      },
      .make_weights = weights,
      // Rank 0: also the calling thread's own stream, where cuda::upload and copy_to_device queue
      // the step's inputs when that thread is not the one that made rank 0's CudaOps.
      .synchronize =
          [stream_of](int rank) {
            cuda_check(cudaStreamSynchronize(stream_of(rank)));
            if (rank == 0 && compute_stream() != stream_of(0))
              cuda_check(cudaStreamSynchronize(compute_stream()));
          },
      // A peer-to-peer copy on the peer's stream, outside any capture.
      .copy_from_rank0 =
          [](const Tensor& src, Tensor& dst) {
            check(src.nbytes() == dst.nbytes(), "tensor parallel: copying ", src.describe(),
                  " into ", dst.describe());
            int device = 0;
            cuda_check(cudaGetDevice(&device));
            cuda_check(cudaMemcpyPeerAsync(dst.raw(), device, src.raw(), 0,
                                           static_cast<std::size_t>(src.nbytes()),
                                           compute_stream()));
          },
      .abort = [group] { group->abort(); }};
  return std::make_unique<TensorParallelModel>(whole, setup, rank0_ops);
}

}  // namespace nibble::cuda
