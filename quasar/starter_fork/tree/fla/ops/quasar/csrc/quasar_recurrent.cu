// QuasarAttention, token by token, as a PyTorch CUDA extension.
//
//   lambda_t = ||k_t||^2,  alpha_t = -expm1(-beta_h * lambda_t) / (lambda_t + 1e-8)
//   S_t = S_{t-1} + alpha_t k_t (v_t - S_{t-1}^T k_t)^T,   o_t = S_t^T q_t
//
// One thread block per (sequence, head); thread j owns column j of the state S [K, V] in
// registers (fp32), so the state never leaves the chip. k_t and q_t are staged in shared memory.
// Built on demand by fla.ops.quasar.fused_recurrent.load_cuda_extension():
//   torch.utils.cpp_extension.load(name=..., sources=["fla/ops/quasar/csrc/quasar_recurrent.cu"])
// Inputs: q, k [1, T, H, K], v [1, T, H, V], beta [H] fp32, cu_seqlens [N + 1] int64 (all CUDA,
// contiguous), optional initial state [N, H, K, V] fp32. Returns (o [1, T, H, V], final state).

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <optional>

namespace {

template <typename scalar_t, int K>
__global__ void quasar_recurrent_kernel(const scalar_t* __restrict__ q,
                                        const scalar_t* __restrict__ k,
                                        const scalar_t* __restrict__ v,
                                        const float* __restrict__ beta,
                                        const float* __restrict__ h0,
                                        const int64_t* __restrict__ cu_seqlens,
                                        scalar_t* __restrict__ o,
                                        float* __restrict__ ht,
                                        int H,
                                        int V) {
  const int n = blockIdx.x / H;
  const int h = blockIdx.x % H;
  const int j = threadIdx.x;
  const bool owns_column = j < V;
  const int64_t bos = cu_seqlens[n];
  const int64_t eos = cu_seqlens[n + 1];
  const int64_t state_base = (static_cast<int64_t>(n) * H + h) * K * V;

  __shared__ float k_shared[K];
  __shared__ float q_shared[K];

  float s[K];
#pragma unroll
  for (int i = 0; i < K; ++i) {
    s[i] = (h0 != nullptr && owns_column) ? h0[state_base + static_cast<int64_t>(i) * V + j] : 0.f;
  }
  const float beta_h = beta[h];

  for (int64_t t = bos; t < eos; ++t) {
    const int64_t qk_base = (t * H + h) * K;
    for (int i = j; i < K; i += blockDim.x) {
      k_shared[i] = static_cast<float>(k[qk_base + i]);
      q_shared[i] = static_cast<float>(q[qk_base + i]);
    }
    __syncthreads();

    float lambda = 0.f;
#pragma unroll
    for (int i = 0; i < K; ++i) lambda += k_shared[i] * k_shared[i];
    const float alpha = -expm1f(-beta_h * lambda) / (lambda + 1e-8f);

    if (owns_column) {
      float predicted = 0.f;
#pragma unroll
      for (int i = 0; i < K; ++i) predicted += s[i] * k_shared[i];
      const float update = alpha * (static_cast<float>(v[(t * H + h) * V + j]) - predicted);
      float out = 0.f;
#pragma unroll
      for (int i = 0; i < K; ++i) {
        s[i] += k_shared[i] * update;
        out += s[i] * q_shared[i];
      }
      o[(t * H + h) * V + j] = static_cast<scalar_t>(out);
    }
    // Everyone is done reading k_t and q_t before the next token overwrites them.
    __syncthreads();
  }

  if (ht != nullptr && owns_column) {
#pragma unroll
    for (int i = 0; i < K; ++i) ht[state_base + static_cast<int64_t>(i) * V + j] = s[i];
  }
}

template <typename scalar_t, int K>
void launch(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& beta,
            const float* h0, const torch::Tensor& cu_seqlens, torch::Tensor& o, float* ht, int N, int H, int V) {
  const int threads = ((V > K ? V : K) + 31) / 32 * 32;
  quasar_recurrent_kernel<scalar_t, K><<<N * H, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), beta.data_ptr<float>(), h0,
      cu_seqlens.data_ptr<int64_t>(), o.data_ptr<scalar_t>(), ht, H, V);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

std::vector<torch::Tensor> quasar_recurrent_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                                    torch::Tensor beta, std::optional<torch::Tensor> initial_state,
                                                    torch::Tensor cu_seqlens, bool output_final_state) {
  for (const auto* t : {&q, &k, &v, &beta, &cu_seqlens}) {
    TORCH_CHECK(t->is_cuda() && t->is_contiguous(), "quasar_recurrent: inputs must be contiguous CUDA tensors");
  }
  TORCH_CHECK(q.dim() == 4 && q.size(0) == 1 && k.sizes() == q.sizes(), "q and k must be [1, T, H, K]");
  TORCH_CHECK(v.dim() == 4 && v.size(1) == q.size(1) && v.size(2) == q.size(2), "v must be [1, T, H, V]");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v must share a dtype");
  TORCH_CHECK(beta.scalar_type() == torch::kFloat32, "beta must be float32");
  TORCH_CHECK(cu_seqlens.scalar_type() == torch::kInt64 && cu_seqlens.dim() == 1, "cu_seqlens must be int64 [N + 1]");
  const int H = static_cast<int>(q.size(2));
  const int K = static_cast<int>(q.size(3));
  const int V = static_cast<int>(v.size(3));
  const int N = static_cast<int>(cu_seqlens.size(0) - 1);
  TORCH_CHECK(beta.numel() == H, "beta must be [H]");
  TORCH_CHECK(V >= 1 && V <= 1024, "V must be between 1 and 1024");

  const c10::cuda::CUDAGuard device_guard(q.device());
  const float* h0 = nullptr;
  if (initial_state.has_value()) {
    const auto& state = initial_state.value();
    TORCH_CHECK(state.is_cuda() && state.is_contiguous() && state.scalar_type() == torch::kFloat32,
                "initial_state must be a contiguous float32 CUDA tensor");
    TORCH_CHECK(state.dim() == 4 && state.size(0) == N && state.size(1) == H && state.size(2) == K &&
                    state.size(3) == V,
                "initial_state must be [N, H, K, V]");
    h0 = state.data_ptr<float>();
  }
  auto o = torch::empty_like(v);
  auto final_state = output_final_state ? torch::empty({N, H, K, V}, q.options().dtype(torch::kFloat32))
                                        : torch::empty({0}, q.options().dtype(torch::kFloat32));
  float* ht = output_final_state ? final_state.data_ptr<float>() : nullptr;
  if (N == 0 || q.size(1) == 0) {
    if (output_final_state) {
      if (h0 != nullptr) final_state.copy_(initial_state.value()); else final_state.zero_();
    }
    return {o, final_state};
  }

  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, q.scalar_type(),
                                  "quasar_recurrent_forward", [&] {
    switch (K) {
      case 16: launch<scalar_t, 16>(q, k, v, beta, h0, cu_seqlens, o, ht, N, H, V); break;
      case 32: launch<scalar_t, 32>(q, k, v, beta, h0, cu_seqlens, o, ht, N, H, V); break;
      case 64: launch<scalar_t, 64>(q, k, v, beta, h0, cu_seqlens, o, ht, N, H, V); break;
      case 128: launch<scalar_t, 128>(q, k, v, beta, h0, cu_seqlens, o, ht, N, H, V); break;
      default: TORCH_CHECK(false, "quasar_recurrent: K must be 16, 32, 64 or 128, got ", K);
    }
  });
  return {o, final_state};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &quasar_recurrent_forward, "QuasarAttention recurrence, token by token (CUDA)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("initial_state"),
        py::arg("cu_seqlens"), py::arg("output_final_state"));
}
