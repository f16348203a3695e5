"""One-command GPU check (issue 11 item 4): every rule's step time over plain TRL, generation-time
recording, and attention-entropy time and memory, on a randomly initialised Qwen2.5-0.5B-shaped model.

Run on a machine with one GPU, no network, in about 3-5 minutes:
    python benchmarks/gpu_check.py            # bf16 on cuda:0
    python benchmarks/gpu_check.py --tiny     # tiny shapes on the CPU (what tests/run/test_gpu_check.py runs)
Needs torch, transformers, trl and this package; nothing is downloaded (the model is built from a
config, the built-in character tokenizer stands in, rollouts come from a rollout_func).

1. Step time, in one process: plain `trl.GRPOTrainer` and every registered rule (default params) train
   the same model on the same fixed-length random rollouts (a rollout_func, so generation time does
   not drown the difference; the rule's statistics then take the separate pass, the costliest path),
   at completion lengths 1024 and 4096. Median of the timed steps (the first is dropped), ratio over
   plain TRL of the same length.
   The same at 1024 with `num_iterations = 2` (TRL makes its old-log-prob forward; the statistics ride
   on it: path "old_logp_forward"), where the timed steps alternate between a step that generates and
   one that reuses the batch, so their mean counts; and `scope: microbatch` for the rules that take it.
   Then on-policy with transformers generation (no rollout_func; 128 new tokens, min = max): the
   statistics are recorded while sampling (path "generation", ICT's JS included in one process).
2. Generation-time recording: `model.generate` of the same prompts with and without
   `signals.generation.record_generation` (entropy, logp, attention entropy of the middle layer).
3. Attention entropy at T = 4096 (one sequence): time and peak memory of one no-grad forward with
   SDPA alone, SDPA + our chunked AE of the middle layer, and eager `output_attentions=True`.
3 and 2 run first (they are short), then 1. The JSON summary is the last line printed; `--json PATH` also writes it
after every arm, and
`--budget-s` skips what is left once that much time has passed, so a hard time limit loses nothing.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1e6,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)
TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def build(tiny: bool):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from stare_lab.models.builtin import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(
        **(TINY if tiny else QWEN25_05B),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    model = Qwen2ForCausalLM(cfg).to(dtype=torch.float32 if tiny else torch.bfloat16)
    return model.to("cpu" if tiny else "cuda"), tok


def fixed_rollouts(length: int):
    """A rollout_func: every completion exactly `length` random tokens (no EOS), the same for every arm."""
    import torch

    def rollout_func(prompts, trainer):
        tok = trainer.processing_class
        g = torch.Generator().manual_seed(trainer.state.global_step)
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        comps = torch.randint(3, len(tok), (len(prompts), length), generator=g).tolist()
        return {"prompt_ids": ids, "completion_ids": comps, "logprobs": None}

    return rollout_func


def step_times(
    model,
    tok,
    rule: str | None,
    length: int,
    rows: int,
    steps: int,
    tiny: bool,
    *,
    num_iterations: int = 1,
    params: dict | None = None,
    generate: bool = False,
) -> list[float]:
    """Seconds per optimizer step (the first step dropped) of plain TRL (rule None) or a rule. generate=False:
    fixed random rollouts of `length` tokens; True: transformers samples exactly `length` new tokens."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from stare_lab.methods import get_method
    from stare_lab.tasks.arithmetic import ArithmeticTask
    from stare_lab.training.trainer import TokenRuleGRPOTrainer

    class Clock(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_step_begin(self, *a, **k):
            _sync(tiny)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            _sync(tiny)
            self.times.append(time.perf_counter() - self.t0)

    def reward(completions, **kw):
        return [float(i % 3) for i in range(len(completions))]

    with tempfile.TemporaryDirectory() as d:
        args = GRPOConfig(
            output_dir=d,
            per_device_train_batch_size=rows,
            num_generations=4,
            gradient_accumulation_steps=1,
            max_completion_length=length,
            max_steps=steps,
            learning_rate=1e-6,
            optim="sgd",
            use_cpu=tiny,
            bf16=not tiny,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=1000,
            seed=0,
            # a rule with passes of its own (Lopti: 2 per generation batch) trains them: it is timed per optimizer step
            num_iterations=num_iterations if rule is None else max(num_iterations, get_method(rule).iterations),
            generation_kwargs={"min_new_tokens": length} if generate else None,
        )
        kw = dict(
            model=copy.deepcopy(model),
            reward_funcs=[reward],
            args=args,
            processing_class=tok,
            train_dataset=ArithmeticTask(train_size=64, heldout_size=4).train_dataset(),
            rollout_func=None if generate else fixed_rollouts(length),
        )
        trainer = (
            GRPOTrainer(**kw) if rule is None else TokenRuleGRPOTrainer(rule=get_method(rule, **(params or {})), **kw)
        )
        clock = Clock()
        trainer.add_callback(clock)
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        del trainer
    _free(tiny)
    return clock.times[1:]


def generation_recording(model, tok, new_tokens: int, rows: int, tiny: bool) -> dict:
    import torch

    from stare_lab.signals.generation import record_generation

    ids = torch.tensor([tok("12+34=", add_special_tokens=False)["input_ids"]] * rows, device=model.device)
    kw = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=tok.pad_token_id,
    )
    times = {}
    for arm in ("plain", "recorded", "plain", "recorded"):
        torch.manual_seed(0)
        _sync(tiny)
        t0 = time.perf_counter()
        with torch.no_grad():
            if arm == "plain":
                model.generate(**kw)
            else:
                with record_generation(model, {"logp", "entropy", "attn_entropy"}):
                    model.generate(**kw)
        _sync(tiny)
        times[arm] = time.perf_counter() - t0  # the second round counts (the first warms up)
    return {
        "new_tokens": new_tokens,
        "rows": rows,
        "plain_s": times["plain"],
        "recorded_s": times["recorded"],
        "ratio": times["recorded"] / times["plain"],
    }


def attention_entropy_cost(model, T: int, tiny: bool) -> dict:
    import torch

    from stare_lab.signals import forward_with_stats

    ids = torch.randint(3, 90, (1, T), device=model.device)
    mask = torch.ones_like(ids)
    middle = model.config.num_hidden_layers // 2
    out = {}

    def forward(mode: str) -> None:
        with torch.no_grad():
            if mode == "sdpa":
                model.model(input_ids=ids, attention_mask=mask, use_cache=False)
            elif mode == "sdpa+ae":
                forward_with_stats(model, ids, mask, ae_layers=(middle,))
            else:
                model.set_attn_implementation("eager")
                try:
                    model.model(input_ids=ids, attention_mask=mask, use_cache=False, output_attentions=True)
                finally:
                    model.set_attn_implementation("sdpa")

    for mode in ("sdpa", "sdpa+ae", "eager_output_attentions"):
        forward(mode)  # warm-up: kernels chosen and loaded outside the timed call
        _free(tiny)
        if not tiny:
            torch.cuda.reset_peak_memory_stats()
        base = 0 if tiny else torch.cuda.memory_allocated()
        _sync(tiny)
        t0 = time.perf_counter()
        forward(mode)
        _sync(tiny)
        peak = 0 if tiny else torch.cuda.max_memory_allocated() - base
        out[mode] = {"time_s": time.perf_counter() - t0, "peak_extra_mib": peak / 2**20}
    return {"T": T, "layer": middle, **out}


def _sync(tiny: bool) -> None:
    if not tiny:
        import torch

        torch.cuda.synchronize()


def _free(tiny: bool) -> None:
    gc.collect()
    if not tiny:
        import torch

        torch.cuda.empty_cache()


def _timed_arms(summary, key, arms_to_run, measure, budget) -> None:
    """summary[key][arm] = {step_s, ratio over the first arm}; skipped arms are named in the root's "skipped"."""
    arms = summary.setdefault(key, {})
    base = None
    for name, run in arms_to_run:
        if budget():
            _OUT["summary"].setdefault("skipped", []).append(f"{key}: {name}")
            continue
        t = measure(run())
        base = base if base is not None else t
        arms[name] = {"step_s": t, "ratio": t / base}
        print(f"{key} {name}: {t:.3f} s/step, {t / base:.3f}x", flush=True)
        _dump()


_OUT: dict = {"json": None, "summary": None}  # where and what _dump writes


def _dump() -> None:
    if _OUT["json"] is not None:
        _OUT["json"].write_text(json.dumps(_OUT["summary"], indent=1))


def _takes_scope(rule: str, scope: str) -> bool:
    """The rule has this scope among its choices (its Params accept it)."""
    from stare_lab.methods import get_method

    try:
        get_method(rule, scope=scope)
    except ValueError:
        return False
    return True


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke test of this script)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per arm (the first is not timed)")
    p.add_argument("--rules", nargs="*", default=None, help="default: every registered rule")
    p.add_argument("--json", type=Path, default=None, help="also write the summary here after every arm")
    p.add_argument("--budget-s", type=float, default=None, help="skip what is left after this many seconds")
    a = p.parse_args(argv)
    _OUT["json"] = a.json
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    from stare_lab.methods import get_method, list_methods
    from stare_lab.training.token_weights import MICROBATCH_STATISTICS

    if not a.tiny and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device (use --tiny for the CPU smoke test)")
    t_start = time.perf_counter()

    def over_budget() -> bool:
        return a.budget_s is not None and time.perf_counter() - t_start > a.budget_s

    model, tok = build(a.tiny)
    rules = a.rules if a.rules is not None else list_methods()
    lengths = {16: 8, 32: 4} if a.tiny else {1024: 8, 4096: 4}  # completion length: rows per step
    short, short_rows = next(iter(lengths.items()))
    gen_tokens = 8 if a.tiny else 128
    summary: dict = {
        "device": "cpu" if a.tiny else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "model": "tiny" if a.tiny else "Qwen2.5-0.5B-shaped, random, bf16",
        "steps": {},
    }
    _OUT["summary"] = summary
    median, mean = statistics.median, statistics.mean

    def arms(**kw):
        return [
            (name, lambda r=r: step_times(model, tok, r, steps=a.steps, tiny=a.tiny, **kw))
            for name, r in [("plain TRL", None), *((r, r) for r in rules)]
        ]

    # the short, required measurements first, so that a time limit can only cut step arms
    summary["attention_entropy"] = attention_entropy_cost(model, 64 if a.tiny else 4096, a.tiny)
    print(f"attention entropy: {summary['attention_entropy']}", flush=True)
    summary["generation_recording"] = generation_recording(model, tok, gen_tokens, 8, a.tiny)
    print(f"generation recording: {summary['generation_recording']}", flush=True)
    _dump()
    for length, rows in lengths.items():  # 1. the separate pass (rollout_func)
        _timed_arms(summary["steps"], str(length), arms(length=length, rows=rows), median, over_budget)
    # num_iterations = 2: generating and reusing steps alternate, so an even number of timed steps, averaged
    _timed_arms(
        summary,
        f"num_iterations_2@{short}",
        [
            (
                n,
                lambda n=n: step_times(
                    model,
                    tok,
                    None if n == "plain TRL" else n,
                    short,
                    short_rows,
                    a.steps + 2,
                    a.tiny,
                    num_iterations=2,
                ),
            )
            for n in ["plain TRL", *rules]
        ],
        mean,
        over_budget,
    )
    micro = [
        r for r in rules if _takes_scope(r, "microbatch") and get_method(r).needs_for(None) <= MICROBATCH_STATISTICS
    ]
    _timed_arms(
        summary,
        f"scope_microbatch@{short}",
        [("plain TRL", lambda: step_times(model, tok, None, short, short_rows, a.steps, a.tiny))]
        + [
            (
                r,
                lambda r=r: step_times(
                    model, tok, r, short, short_rows, a.steps, a.tiny, params={"scope": "microbatch"}
                ),
            )
            for r in micro
        ],
        median,
        over_budget,
    )
    on_policy = [r for r in ("top_entropy", "stare", "anchor", "ict") if r in rules]
    _timed_arms(
        summary,
        f"generation@{gen_tokens}",
        [
            (
                n,
                lambda n=n: step_times(
                    model, tok, None if n == "plain TRL" else n, gen_tokens, short_rows, a.steps, a.tiny, generate=True
                ),
            )
            for n in ["plain TRL", *on_policy]
        ],
        median,
        over_budget,
    )
    summary["wall_s"] = time.perf_counter() - t_start
    _dump()
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
