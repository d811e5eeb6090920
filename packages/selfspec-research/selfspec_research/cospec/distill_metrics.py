"""How close the shallow draft is to its target: the distillation loss and held-out agreement.

The loss is KL(teacher || draft) at a temperature (optionally plus cross-entropy on the
teacher's argmax), per position. Held-out agreement is the acceptance proxy: top-1
agreement between draft and target (= greedy SpS acceptance per position), plus KL and
E[min(p, q)] (acceptance under sampling at temperature 1), overall and per family.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from selfspec_research.lora_training import selected_logits
from selfspec_research.thinker.examples import IGNORE_INDEX, Example, collate


def distill_loss(
    teacher_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    kl_weight: float = 1.0,
    ce_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """kl_weight * T² KL(teacher_T || draft_T) + ce_weight * CE(draft, argmax teacher), per
    position mean; also the KL, CE and top-1 agreement as floats (one host sync)."""
    t_logp = torch.log_softmax(teacher_logits / temperature, dim=-1)
    d_logp = torch.log_softmax(draft_logits / temperature, dim=-1)
    kl = torch.nn.functional.kl_div(d_logp, t_logp, log_target=True, reduction="batchmean") * temperature**2
    teacher_top = teacher_logits.argmax(-1)
    ce = torch.nn.functional.cross_entropy(draft_logits, teacher_top)
    loss = kl_weight * kl + ce_weight * ce if ce_weight else kl_weight * kl
    agree = (draft_logits.argmax(-1) == teacher_top).float().mean()
    values = torch.stack([loss.detach(), kl.detach(), ce.detach(), agree]).tolist()  # one host sync
    return loss, {"loss": values[0], "kl": values[1], "ce": values[2], "agree": values[3]}


@torch.no_grad()
def agreement_metrics(
    teacher: Any, draft: Any, examples: Sequence[Example], pad_id: int, batch_size: int, autocast: Callable[[], Any]
) -> dict[str, Any]:
    """Draft vs target over the assistant positions of `examples` (unpacked, right padded):
    top-1 agreement, KL(target || draft), E[min(p, q)] (acceptance under sampling at T=1);
    overall (position-weighted) and per family."""
    device = next(teacher.parameters()).device
    sums: dict[str, list[float]] = {}
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    was_training = draft.training
    draft.eval()
    for begin in range(0, len(order), batch_size):
        batch = [examples[i] for i in order[begin : begin + batch_size]]
        input_ids, labels = collate(batch, pad_id)
        mask = labels != IGNORE_INDEX
        input_ids, mask = input_ids.to(device), mask.to(device)
        with autocast():
            t = selected_logits(teacher, input_ids, mask)
            d = selected_logits(draft, input_ids, mask)
        p, q = torch.softmax(t, -1), torch.softmax(d, -1)
        kl = (p * (torch.log_softmax(t, -1) - torch.log_softmax(d, -1))).sum(-1)
        overlap = torch.minimum(p, q).sum(-1)
        agree = (t.argmax(-1) == d.argmax(-1)).float()
        rows = torch.stack([agree, kl, overlap], dim=1).cpu()
        counts = mask.sum(1).tolist()
        start = 0
        for example, count in zip(batch, counts):
            part = rows[start : start + count].double().sum(0).tolist()
            start += count
            for key in (example.family, "all"):
                acc = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0])
                acc[0] += part[0]
                acc[1] += part[1]
                acc[2] += part[2]
                acc[3] += count
    draft.train(was_training)
    out: dict[str, Any] = {}
    for key, (agree_sum, kl_sum, overlap_sum, n) in sums.items():
        out[key] = {
            "positions": int(n),
            "top1_agreement": round(agree_sum / n, 5) if n else None,
            "kl": round(kl_sum / n, 5) if n else None,
            "expected_acceptance": round(overlap_sum / n, 5) if n else None,
        }
    return out


def describe_agreement(metrics: dict[str, Any]) -> str:
    """One line of `agreement_metrics`' overall numbers."""
    overall = metrics.get("all", {})
    return (
        f"top-1 agreement {overall.get('top1_agreement')}, KL {overall.get('kl')}, "
        f"E[min(p,q)] {overall.get('expected_acceptance')} over {overall.get('positions')} positions"
    )


__all__ = ["agreement_metrics", "describe_agreement", "distill_loss"]
