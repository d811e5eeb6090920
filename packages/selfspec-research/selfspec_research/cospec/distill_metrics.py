"""How close the shallow draft is to its target: the distillation loss and held-out agreement.

The loss is KL(teacher || draft) at a temperature, optionally plus cross-entropy on the
teacher's argmax and cross-entropy on the reference tokens of the training data, per
position; any of the three may be off, so a draft can be trained on the tasks alone (then
it may solve items its target fails, which is what CoSpec's complementarity needs). Held-out agreement is the acceptance proxy: top-1
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
    reference: torch.Tensor | None = None,
    reference_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """kl_weight * T² KL(teacher_T || draft_T) + ce_weight * CE(draft, argmax teacher) +
    reference_weight * CE(draft, reference), per position mean; also the KL, both CEs
    ("ce": on the teacher's argmax, "ref": on the reference tokens, NaN without them) and
    top-1 agreement with the teacher as floats (one host sync). Every term is measured even
    at weight 0, so logs compare across loss mixes."""
    if reference_weight and reference is None:
        raise ValueError("reference_weight > 0 needs the reference tokens")
    t_logp = torch.log_softmax(teacher_logits / temperature, dim=-1)
    d_logp = torch.log_softmax(draft_logits / temperature, dim=-1)
    kl = torch.nn.functional.kl_div(d_logp, t_logp, log_target=True, reduction="batchmean") * temperature**2
    teacher_top = teacher_logits.argmax(-1)
    ce = torch.nn.functional.cross_entropy(draft_logits, teacher_top)
    ref = (
        torch.nn.functional.cross_entropy(draft_logits, reference)
        if reference is not None
        else torch.full((), float("nan"), device=draft_logits.device)
    )
    loss = kl_weight * kl
    for weight, term in ((ce_weight, ce), (reference_weight, ref)):
        if weight:
            loss = loss + weight * term
    agree = (draft_logits.argmax(-1) == teacher_top).float().mean()
    values = torch.stack([loss.detach(), kl.detach(), ce.detach(), ref.detach(), agree]).tolist()  # one host sync
    return loss, {"loss": values[0], "kl": values[1], "ce": values[2], "ref": values[3], "agree": values[4]}


@torch.no_grad()
def agreement_metrics(
    teacher: Any, draft: Any, examples: Sequence[Example], pad_id: int, batch_size: int, autocast: Callable[[], Any]
) -> dict[str, Any]:
    """Draft vs target over the assistant positions of `examples` (unpacked, right padded):
    top-1 agreement, KL(target || draft), E[min(p, q)] (acceptance under sampling at T=1),
    and the draft's top-1 accuracy and cross-entropy on the reference tokens (how well it
    learned the tasks themselves, whatever the target does); overall (position-weighted)
    and per family."""
    device = next(teacher.parameters()).device
    sums: dict[str, list[float]] = {}
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    was_training = draft.training
    draft.eval()
    for begin in range(0, len(order), batch_size):
        batch = [examples[i] for i in order[begin : begin + batch_size]]
        input_ids, labels = collate(batch, pad_id)
        mask = labels != IGNORE_INDEX
        input_ids, mask, reference = input_ids.to(device), mask.to(device), labels[mask].to(device)
        with autocast():
            t = selected_logits(teacher, input_ids, mask)
            d = selected_logits(draft, input_ids, mask)
        p, q = torch.softmax(t, -1), torch.softmax(d, -1)
        kl = (p * (torch.log_softmax(t, -1) - torch.log_softmax(d, -1))).sum(-1)
        overlap = torch.minimum(p, q).sum(-1)
        agree = (t.argmax(-1) == d.argmax(-1)).float()
        correct = (d.argmax(-1) == reference).float()
        ref_ce = torch.nn.functional.cross_entropy(d, reference, reduction="none")
        rows = torch.stack([agree, kl, overlap, correct, ref_ce], dim=1).cpu()
        counts = mask.sum(1).tolist()
        start = 0
        for example, count in zip(batch, counts):
            part = rows[start : start + count].double().sum(0).tolist()
            start += count
            for key in (example.family, "all"):
                acc = sums.setdefault(key, [0.0] * (len(part) + 1))
                for i, value in enumerate(part):
                    acc[i] += value
                acc[-1] += count
    draft.train(was_training)
    out: dict[str, Any] = {}
    names = ("top1_agreement", "kl", "expected_acceptance", "reference_accuracy", "reference_ce")
    for key, acc in sums.items():
        n = acc[-1]
        out[key] = {"positions": int(n), **{name: round(v / n, 5) if n else None for name, v in zip(names, acc)}}
    return out


def describe_agreement(metrics: dict[str, Any]) -> str:
    """One line of `agreement_metrics`' overall numbers."""
    overall = metrics.get("all", {})
    return (
        f"top-1 agreement {overall.get('top1_agreement')}, KL {overall.get('kl')}, "
        f"E[min(p,q)] {overall.get('expected_acceptance')}, reference accuracy {overall.get('reference_accuracy')} "
        f"over {overall.get('positions')} positions"
    )


__all__ = ["agreement_metrics", "describe_agreement", "distill_loss"]
