"""The untrained built-in model's per-token entropy on its own rollouts (T = 1, top-p 1): where it is uncertain.

docs/demo.md, "The testbed", quotes its output: `python benchmarks/testbed_entropy.py`.
"""

from __future__ import annotations

import torch

from stare_lab.models import load_model_and_tokenizer
from stare_lab.models.train_builtin import MAX_NEW_TOKENS, procedure_of
from stare_lab.tasks.arithmetic import ArithmeticTask

PROBLEMS, SAMPLES, HIGH = 48, 8, 0.5  # the demo's 48 held-out problems, 8 rollouts each (a GRPO group)


def main() -> None:
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer("builtin")
    model.eval()
    rows = ArithmeticTask().heldout_dataset().select(range(PROBLEMS))
    enc = tok(list(rows["prompt"]), return_tensors="pt", padding=True)
    width = enc["input_ids"].shape[1]
    out = model.generate(
        **enc,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=MAX_NEW_TOKENS,
        num_return_sequences=SAMPLES,
    )
    with torch.no_grad():
        logits = model(out, attention_mask=(out != tok.pad_token_id).long()).logits[:, width - 1 : -1]
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)  # [B, T] of the next-token distributions
    completions = out[:, width:]
    valid = torch.ones_like(completions, dtype=torch.bool)
    for i, row in enumerate(completions):
        eos = (row == tok.eos_token_id).nonzero()
        if len(eos):
            valid[i, int(eos[0, 0]) + 1 :] = False  # EOS itself is a decision; what follows is padding
    high = (entropy >= HIGH) & valid
    per_completion = high.sum(1)
    print(f"tokens per completion with H >= {HIGH}: mean {per_completion.float().mean():.2f}, "
          f"histogram {torch.bincount(per_completion).tolist()}")  # fmt: skip
    print(f"mean entropy of the valid tokens: {entropy[valid].mean():.3f} nats")
    print(f"entropy at the first completion token: mean {entropy[:, 0].mean():.3f} nats")
    share = high.float().sum(0) / high.float().sum()
    print(f"share of the high-entropy tokens at positions 0-3: {[round(float(s), 3) for s in share[:4]]}")
    texts = tok.batch_decode(completions, skip_special_tokens=True)
    ids = list(rows["problem_id"])
    procedures = [procedure_of(t, ids[i // SAMPLES]) for i, t in enumerate(texts)]
    print("procedures sampled:", {p: round(procedures.count(p) / len(procedures), 3) for p in sorted(set(procedures))})


if __name__ == "__main__":
    main()
