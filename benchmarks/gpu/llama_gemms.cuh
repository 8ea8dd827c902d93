// SPDX-License-Identifier: Apache-2.0
// The GEMMs of one Llama-3.1-8B-shaped transformer layer (hidden 4096, GQA with 8 KV heads of 128,
// MLP 14336) in bf16 through cuBLAS, for `tokens` new tokens: the stand-in for a model in the
// examples, built as benchmarks/gpu/bench_interference.cu builds its workload (one weight set reused
// by every layer, fp32 accumulation).
#pragma once

#include <strata/cuda.cuh>

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

namespace strata::examples {

#define STRATA_EXAMPLE_CUBLAS(call)                                                                        \
  do {                                                                                                     \
    cublasStatus_t const s_ = (call);                                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
      throw ::strata::cuda_error(std::string{"cuBLAS call " #call " failed: "} + std::to_string(int(s_))); \
    }                                                                                                      \
  } while (0)

namespace detail_gemm {
__global__ inline void fill_bf16(__nv_bfloat16* p, std::size_t n, std::uint32_t seed)
{
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    p[i] = __float2bfloat16((static_cast<float>(x & 0xffff) / 65536.0f - 0.5f) * 0.05f);
  }
}
}  // namespace detail_gemm

/// One layer's QKV, output, gate/up and down projections for up to `max_tokens` tokens.
class llama_layer_gemms {
 public:
  explicit llama_layer_gemms(int max_tokens) : max_tokens_{max_tokens}
  {
    STRATA_EXAMPLE_CUBLAS(cublasCreate(&handle_));
    workspace_ = device_buffer(std::size_t{32} << 20);
    STRATA_EXAMPLE_CUBLAS(cublasSetWorkspace(handle_, workspace_.data(), workspace_.size()));
    auto make = [](std::size_t elems, std::uint32_t seed) {
      device_buffer b(elems * 2);
      detail_gemm::fill_bf16<<<1024, 256>>>(reinterpret_cast<__nv_bfloat16*>(b.data()), elems, seed);
      return b;
    };
    auto const m = std::size_t(max_tokens);
    x_ = make(m * hidden, 1);
    h_ = make(m * mlp, 2);
    y_ = make(m * 2 * mlp, 3);
    w_qkv_ = make(std::size_t(hidden) * qkv, 4);
    w_o_ = make(std::size_t(hidden) * hidden, 5);
    w_gu_ = make(std::size_t(hidden) * 2 * mlp, 6);
    w_d_ = make(std::size_t(mlp) * hidden, 7);
    STRATA_CUDA_TRY(cudaDeviceSynchronize());
  }
  ~llama_layer_gemms() { cublasDestroy(handle_); }
  llama_layer_gemms(llama_layer_gemms const&) = delete;
  llama_layer_gemms& operator=(llama_layer_gemms const&) = delete;

  /// SMs cuBLAS sizes its grids for (0: all): leave the copy kernels' SMs free (`sms_left_for_compute`).
  void set_sm_target(int sms) { STRATA_EXAMPLE_CUBLAS(cublasSetSmCountTarget(handle_, sms)); }

  /// Enqueues one layer's GEMMs for `tokens` tokens (at most `max_tokens`) on `s`.
  void layer(int tokens, cudaStream_t s)
  {
    if (tokens <= 0) { return; }
    STRATA_EXPECTS(tokens <= max_tokens_, "llama_layer_gemms: ", tokens, " tokens, room for ", max_tokens_);
    STRATA_EXAMPLE_CUBLAS(cublasSetStream(handle_, s));
    gemm(w_qkv_, x_, qkv, hidden, tokens);
    gemm(w_o_, x_, hidden, hidden, tokens);
    gemm(w_gu_, x_, 2 * mlp, hidden, tokens);
    gemm(w_d_, h_, hidden, mlp, tokens);
  }

  static constexpr int hidden = 4096;          ///< model width
  static constexpr int qkv = 4096 + 2 * 1024;  ///< 32 query heads, 8 K and 8 V heads of 128
  static constexpr int mlp = 14336;            ///< MLP width

 private:
  // Y (n x m) = W (n x k) * X (k x m), column-major, bf16 in and out, fp32 accumulation.
  void gemm(device_buffer const& w, device_buffer const& x, int n, int k, int m)
  {
    float const alpha = 1, beta = 0;
    STRATA_EXAMPLE_CUBLAS(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, w.data(), CUDA_R_16BF, n,
                                       x.data(), CUDA_R_16BF, k, &beta, y_.data(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
  }

  int max_tokens_;
  cublasHandle_t handle_{};
  device_buffer workspace_;
  device_buffer x_, h_, y_, w_qkv_, w_o_, w_gu_, w_d_;
};

}  // namespace strata::examples
