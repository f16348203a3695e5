"""Train the built-in model: supervised next-token training on a mixture of two procedures.

    python -m stare_lab.models.train_builtin --out stare_lab/models/builtin

The testbed is designed so that RL has something to learn and token rules something to select.
Each training example of ``a+b*c=`` is completed by the correct procedure (product first,
:func:`~stare_lab.tasks.arithmetic.solution`) with probability ``--correct-share`` (default 0.4),
else by the wrong one, left to right (:func:`~stare_lab.tasks.arithmetic.left_to_right`). The
model learns to execute both procedures well and to choose between them at random: the first
completion tokens, which choose the procedure, are the "forking" tokens that decide correctness,
with entropy near ``H(0.4, 0.6) = 0.67`` nats, while the arithmetic that follows is nearly
certain. The untrained model then scores about ``correct_share × execution accuracy`` and RL
with the verifier's reward can raise it by moving the probability of one decision, which GRPO
does in a few steps; a reward independent of correctness has no such direction.

Every ``--eval-every`` steps the script evaluates the held-out split as the demo evaluates it
(T = 1.0, top-p = 0.7): the fraction of samples that choose each procedure, the execution
accuracy within the correct one, and the accuracy. It stops at the first evaluation where the
accuracy lies in ``--target`` (default 0.15-0.50) and the execution accuracy reaches
``--min-execution`` (0.9), and fails if none does within ``--steps``. The budget is counted in
steps, not seconds (the learning-rate schedule runs over ``--steps``), so two runs with the same
seed give the same checkpoint.

Shipped result: ``builtin/train_log.json`` (its ``chosen`` entry and ``history``); docs/demo.md
says what the testbed is and what it is not (a designed mechanism at 1M parameters, not a
language model).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from stare_lab.models.builtin import BUILTIN_DIR, build_model, build_tokenizer
from stare_lab.tasks.arithmetic import ArithmeticTask, left_to_right, solution

MAX_NEW_TOKENS = 24
EVAL_TOP_P = 0.7  # the demo's evaluation setting (STARE, 80/20: T = 1.0, top-p = 0.7)


def operands(problem_id: str) -> tuple[int, int, int]:
    """``"37+4*6"`` → (37, 4, 6)."""
    a, rest = problem_id.split("+")
    b, c = rest.split("*")
    return int(a), int(b), int(c)


def encode_examples(tokenizer, prompts: list[str], solutions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + solution + EOS`` ids [N, L] and labels [N, L] (-100 off the completion)."""
    ids, labels = [], []
    for prompt, sol in zip(prompts, solutions, strict=True):
        p = tokenizer(prompt)["input_ids"]
        c = tokenizer(sol)["input_ids"] + [tokenizer.eos_token_id]
        ids.append(torch.tensor(p + c))
        labels.append(torch.tensor([-100] * len(p) + c))
    return (
        pad_sequence(ids, batch_first=True, padding_value=tokenizer.pad_token_id),
        pad_sequence(labels, batch_first=True, padding_value=-100),
    )


def _pad_to(x: torch.Tensor, width: int, value: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def procedure_of(completion: str, problem_id: str) -> str:
    """Which procedure a completion follows: ``correct``, ``left_to_right`` or ``other``."""
    a, b, c = operands(problem_id)
    if completion.startswith(f"{b}*{c}="):
        return "correct"
    if completion.startswith(f"{a}+{b}="):
        return "left_to_right"
    return "other"


@torch.no_grad()
def heldout_profile(
    model, tokenizer, task: ArithmeticTask, problems, *, top_p: float = EVAL_TOP_P, seed: int = 0, batch_size: int = 256
) -> dict[str, float]:
    """Sampled at T = 1 with ``top_p``: accuracy, each procedure's share, execution accuracy.

    ``exec_acc`` is the accuracy among samples that chose the correct procedure.
    """
    model.eval()
    torch.manual_seed(seed)
    counts = {"correct": 0, "left_to_right": 0, "other": 0}
    right = right_in_correct = 0
    for start in range(0, len(problems), batch_size):
        rows = problems[start : start + batch_size]
        enc = tokenizer(rows["prompt"], return_tensors="pt", padding=True, padding_side="left")
        out = model.generate(
            **enc, max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=1.0, top_p=top_p, top_k=0
        )
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for text, answer, pid in zip(texts, rows["answer"], rows["problem_id"], strict=True):
            proc = procedure_of(text, pid)
            ok = task.verify(text, answer)
            counts[proc] += 1
            right += ok
            right_in_correct += ok and proc == "correct"
    model.train()
    n = len(problems)
    return dict(
        acc=right / n,
        share_correct=counts["correct"] / n,
        share_left_to_right=counts["left_to_right"] / n,
        share_other=counts["other"] / n,
        exec_acc=right_in_correct / max(counts["correct"], 1),
    )


@torch.no_grad()
def heldout_accuracy(
    model, tokenizer, task: ArithmeticTask, problems, *, sample: bool, seed: int = 0, batch_size: int = 256
) -> float:
    """Fraction of ``problems`` answered correctly; sampling is plain T=1 (no top-k, no top-p)."""
    model.eval()
    torch.manual_seed(seed)
    correct = 0
    for start in range(0, len(problems), batch_size):
        rows = problems[start : start + batch_size]
        enc = tokenizer(rows["prompt"], return_tensors="pt", padding=True, padding_side="left")
        kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0) if sample else dict(do_sample=False)
        out = model.generate(**enc, max_new_tokens=MAX_NEW_TOKENS, **kwargs)
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        correct += sum(task.verify(t, a) for t, a in zip(texts, rows["answer"], strict=True))
    model.train()
    return correct / len(problems)


def _lr(step: int, base: float, warmup: int, total: int) -> float:
    """Linear warm-up, then linear decay to 10% of ``base`` at ``total``."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (1.0 - 0.9 * (step - warmup) / max(total - warmup, 1))


def _mixture(tokenizer, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids and labels [N, L] of both procedures for every problem (one width for both)."""
    ops = [operands(pid) for pid in rows["problem_id"]]
    good_ids, good_labels = encode_examples(tokenizer, rows["prompt"], [solution(*o) for o in ops])
    bad_ids, bad_labels = encode_examples(tokenizer, rows["prompt"], [left_to_right(*o) for o in ops])
    width = max(good_ids.shape[1], bad_ids.shape[1])
    pad = tokenizer.pad_token_id
    return (
        _pad_to(good_ids, width, pad),
        _pad_to(good_labels, width, -100),
        _pad_to(bad_ids, width, pad),
        _pad_to(bad_labels, width, -100),
    )


def on_target(profile: dict, args: argparse.Namespace) -> bool:
    """The held-out accuracy lies in ``--target`` and the arithmetic is learnt (``--min-execution``)."""
    lo, hi = args.target
    return lo <= profile["acc"] <= hi and profile["exec_acc"] >= args.min_execution


def train(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    task = ArithmeticTask(train_size=args.train_size, heldout_size=200, seed=args.seed)
    train_rows, heldout = task.train_dataset(), task.heldout_dataset()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    good_ids, good_labels, bad_ids, bad_labels = _mixture(tokenizer, train_rows)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(args.seed)
    history, t0 = [], time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        for g in opt.param_groups:
            g["lr"] = _lr(step - 1, args.lr, args.warmup, args.steps)
        idx = torch.randint(0, len(good_ids), (args.batch_size,), generator=gen)
        good = (torch.rand(args.batch_size, generator=gen) < args.correct_share)[:, None]  # [N, 1]
        ids = torch.where(good, good_ids[idx], bad_ids[idx])
        labels = torch.where(good, good_labels[idx], bad_labels[idx])
        attention = (ids != tokenizer.pad_token_id).long()
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every and step != args.steps:
            continue
        profile = heldout_profile(model, tokenizer, task, heldout, seed=args.seed)
        history.append(dict(step=step, loss=loss.item(), **profile, seconds=time.perf_counter() - t0))
        print(
            f"step {step:5d}  loss {loss.item():.4f}  acc {profile['acc']:.3f}  "
            f"correct procedure {profile['share_correct']:.3f}  left-to-right {profile['share_left_to_right']:.3f}  "
            f"other {profile['share_other']:.3f}  execution {profile['exec_acc']:.3f}  "
            f"{history[-1]['seconds']:.0f}s",
            flush=True,
        )
        if on_target(profile, args):
            break
    chosen = history[-1]
    if not on_target(chosen, args):
        lo, hi = args.target
        raise SystemExit(
            f"no checkpoint on target (acc in [{lo}, {hi}], execution ≥ {args.min_execution}) "
            f"within {args.steps} steps: {chosen}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = dict(
        chosen=chosen,
        total_seconds=time.perf_counter() - t0,
        args=vars(args),
        history=history,
        n_params=sum(p.numel() for p in model.parameters()),
    )
    (out / "train_log.json").write_text(json.dumps(record, indent=1))
    print(f"saved step {chosen['step']} to {out}: held-out acc {chosen['acc']:.3f} (T=1, top-p {EVAL_TOP_P})")
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(BUILTIN_DIR))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument(
        "--steps", type=int, default=2000, help="at most; training stops at the first evaluation on target"
    )
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--min-execution", type=float, default=0.9)
    parser.add_argument("--correct-share", type=float, default=0.4)
    parser.add_argument("--target", type=float, nargs=2, default=(0.15, 0.50), metavar=("LOW", "HIGH"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    train(args)


if __name__ == "__main__":
    main()
