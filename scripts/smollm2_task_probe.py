"""The untrained SmolLM2-135M-Instruct's score on candidate Reasoning Gym datasets: a first look for the
task pilot of issue 46 (analysis/smollm2_pilot/results.md).

    python scripts/smollm2_task_probe.py '[["chain_sum", {}]]' QUESTIONS SAMPLES MAX_TOKENS [TASK_KEYS]

Samples at T=1.0, top-p 1.0 from the chat-templated prompt of the task's template (the default, or
TASK_KEYS' `template`), reads the answer as TASK_KEYS' `answer` says (default: the `<answer>` tag), and
scores each completion with the dataset's own score_answer (stare_lab.tasks.reasoning_gym).
"""

import json
import sys
import time

import torch

from stare_lab.models import load_model_and_tokenizer
from stare_lab.tasks.reasoning_gym import ReasoningGymTask

torch.manual_seed(0)
model, tok = load_model_and_tokenizer("smollm2")
model.eval()
cands = json.loads(sys.argv[1])
NQ, N, MAXT = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
KEYS = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
for name, cfg in cands:
    t0 = time.time()
    task = ReasoningGymTask([{"name": name, "weight": 1.0, "config": cfg}], train_size=10, heldout_size=NQ, **KEYS)
    task.bind_tokenizer(tok)
    recs = task.benchmark_records(name)
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in recs]
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            max_new_tokens=MAXT,
            num_return_sequences=N,
            pad_token_id=tok.pad_token_id,
        )
    comp = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    sc = []
    ext = 0
    for i, c in enumerate(comp):
        s, ok = task.score_one(c, recs[i // N]["problem_id"])
        sc.append(s)
        ext += ok
    print(
        f"{name} {cfg}: score {100 * sum(sc) / len(sc):.1f}% full {100 * sum(s == 1 for s in sc) / len(sc):.1f}%"
        f" extracted {100 * ext / len(sc):.0f}% ({time.time() - t0:.0f}s)",
        flush=True,
    )
    print("   Q:", recs[0]["prompt"][-1]["content"][:150].replace("\n", " "), "| A:", recs[0]["answer"])
    for c in comp[:2]:
        print("   C:", c[:160].replace("\n", " | "))
