"""The set-up of the loss-composition tests, written once (docs/trl_parity.md).

A tiny model saved to disk (`setup`), the TRL features whose loss ours must compose with (`FEATURES`:
GRPOConfig overrides, plus the vLLM importance-sampling mode to simulate and whether β > 0 needs the
model on disk), a (plain TRL, ours) trainer pair with one feature (`make_pair`), an off-policy generation
batch (`generation_batch`), the training forward (`current_logps`), one loss call's loss, gradients and
metric rows (`loss_and_grads`), and the check that `full` is plain TRL to the bit (`assert_full_equals_plain`).

Used by tests/training/test_loss_compose.py, test_loss_compose_models.py, test_loss_rules.py and
tests/methods/test_dual_clip.py. `one_thread` and `setup` are pytest fixtures: a test file imports them.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures_trainer import TRL_DEFAULT, grpo_config
from trl import GRPOTrainer

from stare_lab.methods import NORMALIZE, get_method
from stare_lab.models.builtin import build_model, build_tokenizer
from stare_lab.tasks.arithmetic import ArithmeticTask
from stare_lab.training.trainer import TokenRuleGRPOTrainer

G = 4

# feature → GRPOConfig overrides; "vllm": the importance-sampling mode to simulate (TRL's loss reads
# only the flags and the batch's ratio, so no vLLM is needed); "ref": β > 0 needs the model on disk.
FEATURES = {
    "cispo": dict(loss_type="cispo", epsilon_high=1.1),
    "sapo": dict(loss_type="sapo"),
    "luspo_sequence": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "vespo": dict(loss_type="vespo"),
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence"),
    "gspo_dapo": dict(loss_type="dapo", importance_sampling_level="sequence"),
    "bnpo_two_sided": dict(loss_type="bnpo", delta=1.2),
    "dr_grpo": dict(loss_type="dr_grpo"),
    "off_policy_mask": dict(off_policy_mask_threshold=0.02),
    "vllm_is_token": dict(vllm="token_truncate"),
    "vllm_is_sequence_grpo": dict(loss_type="grpo", vllm="sequence_mask"),
    "vllm_is_vespo": dict(loss_type="vespo", vllm="token_mask"),
    "entropy_bonus": dict(entropy_coef=0.1),
    "entropy_bonus_sapo": dict(loss_type="sapo", entropy_coef=0.1),
    "adaptive_entropy": dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_target=100.0),
    "kl_bias_corrected_gspo": dict(
        beta=0.04, use_bias_correction_kl=True, importance_sampling_level="sequence", ref=True
    ),
    "everything_dapo": dict(
        beta=0.04, entropy_coef=0.05, off_policy_mask_threshold=0.02, vllm="token_truncate", ref=True
    ),
}


def length_reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: a second torch thread only contends on the shared CPU cores (several times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    saved = tmp_path_factory.mktemp("model")
    model.save_pretrained(saved)
    tok.save_pretrained(saved)
    return tok, model, str(saved), ArithmeticTask(train_size=64, heldout_size=16)


def make_pair(setup, tmp_path, feature, rule="full"):
    """(plain TRL, ours) with one feature (a FEATURES key or its dict), and the generation batch ours made."""
    tok, model, saved, task = setup
    kw = dict(FEATURES[feature] if isinstance(feature, str) else feature)
    vllm, ref = kw.pop("vllm", None), kw.pop("ref", False)
    args = grpo_config(tmp_path, num_generations=G, gradient_accumulation_steps=2, logging_steps=TRL_DEFAULT, **kw)
    ds = task.train_dataset()

    def model_arg():
        return saved if ref else copy.deepcopy(model)

    plain = GRPOTrainer(
        model=model_arg(), reward_funcs=[length_reward], args=args, train_dataset=ds, processing_class=tok
    )
    ours = TokenRuleGRPOTrainer(
        model=model_arg(),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=ds,
        processing_class=tok,
        rule=get_method(rule),
    )
    batch = generation_batch(ours, ds, vllm)
    for t in (plain, ours):
        t.model.train()
        t.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        if vllm:  # after generating: the flags switch TRL's loss only
            t.use_vllm, t.vllm_importance_sampling_correction, t.vllm_importance_sampling_mode = True, True, vllm
        if t.use_adaptive_entropy:
            t._last_world_entropy = 0.0  # the bonus applies from the first window (TRL starts at +inf: off)
    return plain, ours, batch


def generation_batch(trainer, ds, vllm):
    rows = [ds[i] for i in range(2)]
    trainer.model.train()
    torch.manual_seed(1)
    batch = trainer._generate_and_score_completions([r for r in rows for _ in range(G)])
    logp = current_logps(trainer, batch)[0]
    mask = batch["completion_mask"]
    gen = torch.Generator().manual_seed(2)
    # An earlier policy and a sampler that differ from the current one, so ratios, clipping and masks bite.
    batch["old_per_token_logps"] = logp + 0.3 * torch.randn(logp.shape, generator=gen) * mask
    batch["sampling_per_token_logps"] = logp + 0.3 * torch.randn(logp.shape, generator=gen) * mask
    if vllm:
        sequence = vllm.startswith("sequence")
        shape = (mask.size(0), 1) if sequence else mask.shape
        ratio = torch.empty(shape).uniform_(0.5, 1.5, generator=gen)
        batch["importance_sampling_ratio"] = ratio if sequence else torch.where(mask > 0, ratio, 1.0)
    return batch


@torch.no_grad()
def current_logps(trainer, batch):
    """Log-probs, entropies and MoE aux loss of the training forward, as TRL's loss computes them."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    am = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    extra = {
        k: batch[k]
        for k in (
            "pixel_values",
            "image_grid_thw",
            "num_images",
            "token_type_ids",
            "mm_token_type_ids",
            "image_sizes",
            "pixel_attention_mask",
        )
        if k in batch
    }
    return trainer._get_per_token_logps_and_entropies(
        trainer.model,
        ids,
        am,
        batch["completion_ids"].size(1),
        compute_entropy=True,
        compute_aux_loss=trainer.aux_loss_enabled,
        **extra,
    )


def loss_and_grads(trainer, batch):
    """Loss, gradients and the metric rows the loss call appended (TRL's keys only)."""
    before = {k: len(v) for k, v in trainer._metrics["train"].items()}
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else None for p in trainer.model.parameters()]
    rows = {
        k: [x if x == x else "nan" for x in v[before.get(k, 0) :]]
        for k, v in trainer._metrics["train"].items()
        if not k.startswith(("tokens/", "geometry/")) and len(v) > before.get(k, 0)
    }
    return loss.detach(), grads, rows


def assert_full_equals_plain(plain, ours, batch):
    l_plain, g_plain, m_plain = loss_and_grads(plain, batch)
    l_ours, g_ours, m_ours = loss_and_grads(ours, batch)
    assert torch.equal(l_plain, l_ours), (l_plain.item(), l_ours.item())
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(g_plain, g_ours, strict=True))
    assert any(g is not None and g.abs().sum() > 0 for g in g_ours), "the batch must give a gradient"
    assert m_plain == m_ours and "entropy" in m_ours
    return l_ours


def selecting_weights(mask, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    if kind == "binary":
        w = (torch.rand(mask.shape, generator=gen) < 0.4).float()
        w[0] = 0.0  # a row with nothing selected
    else:
        w = torch.rand(mask.shape, generator=gen) * 1.5
    return w * mask


def weighted(batch, w, normalize=None):
    """`batch` with a rule's loss inputs for the weights `w` (and its normalisation, when given)."""
    out = {**batch, "token_weights": w, "token_weight_total": w.sum(), "token_selected": (w > 0).float()}
    if normalize is not None:
        out["token_normalize"] = torch.tensor(NORMALIZE.index(normalize))
    return out
