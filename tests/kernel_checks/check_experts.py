"""runtime/kernels/experts.py: route's and combine_experts' Triton kernels (interpreted) against their
references (the runtime's tests hold those to transformers' MoE blocks): the chosen experts and their
weights, renormalised or not, from a strided view of a fused router output; the combination with and without a
shared expert; batch invariance."""

from __future__ import annotations

import pytest
import torch

from specpair.formats.packed import Packed
from specpair.runtime.kernels import experts, linear


def assert_within_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and not got.isnan().any(), "unwritten (NaN) elements"
    ulp = 2.0**-7 if want.dtype == torch.bfloat16 else 2.0**-20
    assert ((got.float() - want.float()).abs() <= ulp * want.float().abs() + 1e-6).all()


@pytest.mark.parametrize("renormalise", [False, True])
@pytest.mark.parametrize("tokens,num_experts,top_k", [(1, 256, 8), (17, 40, 3), (3, 16, 16)])
def test_route(tokens: int, num_experts: int, top_k: int, renormalise: bool) -> None:
    torch.manual_seed(tokens + num_experts)
    # [router logits | shared expert gate]; float32, which has no ties to break (bf16 logits tie often, and
    # torch.topk breaks ties its own way: the GPU only ever runs the kernel, which takes the lower id)
    fused = torch.randn(tokens, num_experts + 1) * 3
    logits = fused[:, :num_experts]
    want_w, want_ids = experts.route_reference(logits, top_k, renormalise)
    got_w, got_ids = experts.route_triton(logits, top_k, renormalise)
    assert torch.equal(got_ids, want_ids) and got_ids.dtype == torch.int32
    assert_within_rounding(got_w, want_w)
    if renormalise:
        assert torch.allclose(got_w.sum(-1), torch.ones(tokens))
    for t in (0, tokens - 1):
        w, ids = experts.route_triton(logits[t : t + 1].clone(), top_k, renormalise)
        assert torch.equal(w[0], got_w[t]) and torch.equal(ids[0], got_ids[t])


def test_route_ties_go_to_the_lower_expert() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, 2.0]])
    weights, ids = experts.route_triton(logits, 4, False)
    assert ids.tolist() == [[1, 3, 5, 2]]
    assert weights[0, 0] == weights[0, 1] == weights[0, 2] > weights[0, 3]


def inputs(tokens: int, top_k: int, hidden: int, shared: bool):
    torch.manual_seed(tokens * 10 + top_k)
    weights = experts.route_reference(torch.randn(tokens, 16), top_k, False)[0]
    down = torch.randn(tokens, top_k, hidden).bfloat16()
    if not shared:
        return weights, down, None, None
    router = torch.randn(tokens, 16 + 1).bfloat16()  # [routed logits | shared gate logit]
    return weights, down, torch.randn(tokens, hidden).bfloat16(), router[:, 16:]


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("tokens,top_k,hidden", [(1, 8, 64), (17, 2, 1100)])
def test_combine(tokens: int, top_k: int, hidden: int, shared: bool) -> None:
    weights, down, shared_out, logit = inputs(tokens, top_k, hidden, shared)
    want = experts.combine_experts_reference(weights, down, shared_out, logit)
    got = experts.combine_experts_triton(weights, down, shared_out, logit)
    # float32 sums in the same order: the interpreter's exp (numpy's) may move the shared scale by an ulp
    assert_within_rounding(got, want)
    if not shared:
        assert torch.equal(got, want)
    for t in (0, tokens - 1):
        one = [a[t : t + 1].clone() if a is not None else None for a in (weights, down, shared_out, logit)]
        assert torch.equal(experts.combine_experts_triton(*one)[0], got[t])
        assert torch.equal(experts.combine_experts_reference(*one)[0], want[t])


def test_mismatched_shapes_are_refused() -> None:
    weights, down, _, _ = inputs(4, 3, 8, False)
    with pytest.raises(ValueError, match="do not fit"):
        experts.combine_experts_triton(weights[:, :2], down, None, None)
    with pytest.raises(ValueError, match="route: top 9"):
        experts.route_triton(torch.randn(2, 8), 9, False)


def test_route_given_expert_stacks_to_prefetch_routes_alike() -> None:
    """The stacks route may ask L2 for (PDL mode 2, never under the interpreter) change none of its results; what
    it is given is checked: at most PREFETCHED stacks, each [E, ...] and contiguous. linear.expert_stacks gives a
    MoE's, largest first, leaving out what is smaller than a kilobyte an expert."""
    torch.manual_seed(5)
    logits = torch.randn(3, 16) * 3
    codes = torch.randint(0, 255, (16, 64, 32), dtype=torch.uint8)  # 2 KB an expert
    scales = torch.randn(16, 64, 8).bfloat16()  # 1 KB
    dense = torch.randn(16, 32, 16).bfloat16()  # 1 KB
    per_tensor = torch.ones(16)
    packed = Packed("experts.gate_up_proj", "nvfp4-modelopt", (16, 64, 64), {"codes": codes, "scale": per_tensor})
    stacks = linear.expert_stacks([packed, scales, dense])
    assert [t.data_ptr() for t in stacks] == [codes.data_ptr(), scales.data_ptr(), dense.data_ptr()]
    plain = experts.route_triton(logits, 4, True)
    given = experts.route_triton(logits, 4, True, stacks)
    assert all(torch.equal(a, b) for a, b in zip(plain, given))
    with pytest.raises(ValueError, match="at most 4"):
        experts.route_triton(logits, 4, True, [codes] * 5)
    with pytest.raises(ValueError, match="at most 4"):
        experts.route_triton(logits, 4, True, [codes[:8]])
    # what a route's tokens x top_k experts ask of L2 stays within its budget: a prefix of the stacks, or none
    budget = experts.PREFETCH_BUDGET
    assert experts.within_budget(stacks, budget // (4 << 10)) == stacks  # 4 KB an expert in all: all fit
    assert experts.within_budget(stacks, budget // (3 << 10)) == stacks[:2]
    assert experts.within_budget(stacks, budget // (2 << 10) + 1) == []


@pytest.mark.parametrize("tokens,top_k", [(1, 8), (5, 3)])
def test_a_shared_expert_in_the_stacks(tokens: int, top_k: int) -> None:
    """route appends the shared expert's id E to every token's ids (weights unchanged), and combine reads its
    output as down's last column in place: the same bits as given apart."""
    torch.manual_seed(tokens + top_k)
    logits = torch.randn(tokens, 16 + 1)[:, :16] * 3
    for route in (experts.route_triton, experts.route_reference):
        plain_w, plain_ids = route(logits, top_k, True)
        w, ids = route(logits, top_k, True, shared_id=16)
        assert torch.equal(w, plain_w) and ids.dtype == torch.int32
        assert torch.equal(ids[:, :top_k], plain_ids) and (ids[:, top_k] == 16).all()
    weights, down, shared, logit = inputs(tokens, top_k, 1100, True)
    together = torch.cat((down, shared[:, None]), dim=1)  # [N, k + 1, H]: the shared expert's output last
    for combine in (experts.combine_experts_triton, experts.combine_experts_reference):
        assert torch.equal(combine(weights, together, together[:, top_k], logit), combine(weights, down, shared, logit))
    with pytest.raises(ValueError, match="do not fit"):
        experts.combine_experts_triton(weights, together, None, None)  # a column past k needs the shared expert


@pytest.mark.parametrize("splits", [2, 8])
def test_route_and_combine_add_the_routers_split_sums(splits: int) -> None:
    """The router|shared-gate product's float32 partials, as column views: route's choice and weights and
    combine's output are those of summing them first (the matmul's sum kernel) and reading the bf16 sums; a token
    alone as among others."""
    torch.manual_seed(splits)
    tokens, num_experts, top_k, hidden = 5, 40, 4, 96
    partial = torch.randn(splits, tokens, num_experts + 1) * 2
    sums = linear.SplitSums(partial, torch.bfloat16)
    summed = sums.summed()
    router, gate = sums.columns(0, num_experts), sums.columns(num_experts, num_experts + 1)
    want_w, want_ids = experts.route_triton(summed[:, :num_experts], top_k, True)
    got_w, got_ids = experts.route_triton(router, top_k, True)
    assert torch.equal(got_ids, want_ids) and torch.equal(got_w, want_w)
    down = torch.randn(tokens, top_k + 1, hidden).bfloat16()
    want = experts.combine_experts_triton(want_w, down, down[:, top_k], summed[:, num_experts:])
    got = experts.combine_experts_triton(got_w, down, down[:, top_k], gate)
    assert torch.equal(got, want)
    alone = linear.SplitSums(partial[:, 2:3].clone(), torch.bfloat16)
    w, ids = experts.route_triton(alone.columns(0, num_experts), top_k, True)
    assert torch.equal(w[0], got_w[2]) and torch.equal(ids[0], got_ids[2])
    one = experts.combine_experts_triton(w, down[2:3], down[2:3, top_k], alone.columns(num_experts, num_experts + 1))
    assert torch.equal(one[0], got[2])
    # its shared-gate logit's partials alone and contiguous: planes one element apart, which Triton's JIT compiles
    # as the constant 1 (tools/compile_kernels.py compiles it so)
    logit = linear.SplitSums(partial[:, 2:3, num_experts:].clone(), torch.bfloat16)
    assert logit.partial.stride(0) == 1
    assert torch.equal(experts.combine_experts_triton(w, down[2:3], down[2:3, top_k], logit)[0], got[2])
