"""The runtime's compute kernels: weight-only matmuls for every packed layout, and the fusing of projections
that read one input (linear.py), RMS norms and the residual add before one (norm.py), rotary with the q/k
norm and the cache write (qk.py), attention over a static cache (attention.py), the SwiGLU gate
(activation.py), MoE routing and combination (experts.py), the Gated DeltaNet conv, gates and recurrence
(gdn.py), and DFlash2's dynamic convolution (conv.py) and candidate selector: its top-k over the vocabulary and
its walk over a block (selector.py).

Every public function dispatches on its input's device: CUDA tensors run the Triton kernel, CPU tensors the
torch reference (`*_reference`), which is also what the Triton kernel (`*_triton`, which runs on CPU tensors
under TRITON_INTERPRET=1) is tested against. Dtypes: activations bf16 on the GPU (float32 and f16 work, with
float32 dots: slower), float32 on the CPU; results in the activation's dtype, accumulated in float32.

Both paths are batch-invariant, the property the speculative loop's bit-equality rests on: the bits of one
row's result do not depend on how many rows share the call. The Triton kernels use one tile configuration
whatever the number of rows (it may depend on the weight's or cache's shape, never on M, T or B), a fixed
reduction order per row and float32 accumulation; row counts are not specialised on (no `== 1` or `% 16`
variants) nor are activation pointers on their alignment, so every call of a weight runs the same binary.
On the CPU, torch's matmul is not row-invariant, so every reference product goes through one fixed shape, a
zero-padded tile of rows in a fresh, aligned buffer, whatever the number of rows (cpu_rows.py). torch's CPU elementwise kernels are not either
where a row's width is not a multiple of their SIMD chunk (the last elements of a tensor take a scalar path
whose exp may differ in the last bit): the references apply them row by row too.
"""
