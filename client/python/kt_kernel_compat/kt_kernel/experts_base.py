"""GPU expert masks and the default deferral selector, with kt-kernel's contracts.

generate_gpu_experts_masks is kt-kernel's function (SGLang imports it from kt_kernel to build
every layer's gpu_experts_mask at start-up), plus a strategy= keyword offering moe-sidecar's
placement strategies over the same input. default_deferred_split is kt-kernel's
select_deferred_experts, the one KTMoEWrapper uses unless an engine installs its own.
"""

import torch

import moe_sidecar

STRATEGIES = moe_sidecar.PLACEMENT_STRATEGIES


def generate_gpu_experts_masks(activation_freq, num_gpu_experts, strategy="frequency"):
    """Which experts to keep on the GPU: activation_freq [num_layers, num_experts] (counts,
    frequencies, heat: any non-negative load), num_gpu_experts the budget over all layers.
    Returns a CPU bool tensor [num_layers, num_experts], True = on the GPU.

    strategy="frequency" is kt-kernel's algorithm exactly: the num_gpu_experts highest
    entries over all layers at once (torch.topk over the flattened table; the budget clamped
    to 0..num_layers*num_experts), so a layer may get many or none. The other strategies are
    moe-sidecar's (moe_sidecar.placement): "uniform" (budget / layers per layer, each layer's
    hottest), "front-loading" (whole layers from the first), "balanced" (one at a time, the
    hottest expert of the layer with the most load left on the CPU)."""
    freq = torch.as_tensor(activation_freq)
    if freq.dim() != 2:
        raise ValueError(f"activation_freq: shape {tuple(freq.shape)}, want "
                         "[num_layers, num_experts]")
    L, E = (int(d) for d in freq.shape)
    n = max(0, min(int(num_gpu_experts), L * E))
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: one of {', '.join(STRATEGIES)}")
    if strategy != "frequency":
        p = moe_sidecar.placement(freq.to(torch.float64).cpu(), n, strategy)
        return torch.tensor(p["gpu_experts_mask"], dtype=torch.bool)
    mask = torch.zeros(L * E, dtype=torch.bool)
    if n:
        top = torch.topk(freq.reshape(-1).cpu(), k=n, largest=True, sorted=False).indices
        mask[top] = True
    return mask.view(L, E)


def default_deferred_split(num_experts, expert_ids, expert_scores, protected_k):
    """kt-kernel's select_deferred_experts: of each token's ids the protected_k highest-scored
    are protected; an expert protected for any token of the batch is immediate for every
    token (one pass over each expert), every other entry deferred. Returns (immediate_ids,
    deferred_ids), each [n, k] with -1 where the entry belongs to the other part."""
    k = int(expert_ids.shape[1])
    protected_k = max(0, min(int(protected_k), k))
    if protected_k == 0:
        return torch.full_like(expert_ids, -1), expert_ids.clone()
    top = torch.topk(expert_scores, k=protected_k, dim=-1, largest=True, sorted=False).indices
    chosen = torch.gather(expert_ids, -1, top).reshape(-1)
    chosen = chosen[(chosen >= 0) & (chosen < num_experts)]
    protected = torch.zeros(num_experts + 1, dtype=torch.bool, device=expert_ids.device)
    protected[chosen] = True
    # Ids of no expert (-1, out of range) index the extra entry: never protected.
    slot = torch.where((expert_ids >= 0) & (expert_ids < num_experts), expert_ids,
                       torch.full_like(expert_ids, num_experts))
    keep = protected[slot]
    minus = torch.full_like(expert_ids, -1)
    return torch.where(keep, expert_ids, minus), torch.where(keep, minus, expert_ids)


__all__ = ["generate_gpu_experts_masks", "default_deferred_split", "STRATEGIES"]
