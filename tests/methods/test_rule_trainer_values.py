"""Trainer values reach rules through RuleState.trainer: GMTS's unset ε/β are the trainer's, an explicit
value that disagrees is one line at resolve time (Rule.check_trainer), and TrainerValues.from_config
maps the trainer config keys."""

from __future__ import annotations

import pytest
import torch

from stare_lab.methods import RuleState, TrainerValues, get_method
from stare_lab.stats import TokenStats

TRAINER = TrainerValues(epsilon_low=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo", num_generations=4)


def test_gmts_reads_the_trainer_values():
    """Unset eps/beta are the trainer's; the effective β decides whether ref_logp is read."""
    rule = get_method("gmts")
    kl = TrainerValues(**{**vars(TRAINER), "beta": 0.04})
    assert rule.needs_for(TRAINER) == {"logp", "entropy", "old_logp"}
    assert rule.needs_for(kl) == {"logp", "entropy", "old_logp", "ref_logp"}
    p = rule.effective_params(kl)
    assert (p.eps_low, p.eps_high, p.beta) == (0.2, 0.28, 0.04)
    with pytest.raises(ValueError, match="no trainer values"):
        rule(
            TokenStats(
                logp=torch.zeros(1, 2),
                mask=torch.ones(1, 2),
                advantages=torch.ones(1),
                group=torch.zeros(1, dtype=torch.long),
                entropy=torch.ones(1, 2),
            ),
            RuleState(),
        )
    # ε_high from the trainer decides the clip indicator: r = e^0.22 = 1.246 with A > 0 is inside
    # 1 + 0.28 (kept, δ = 5·1.246) but clipped at 1 + 0.2 (δ = 0, the other token is kept)
    stats = TokenStats(
        logp=torch.tensor([[-0.78, -1.0]]),
        old_logp=torch.tensor([[-1.0, -1.0]]),
        mask=torch.ones(1, 2),
        advantages=torch.tensor([1.0]),
        group=torch.tensor([0]),
        entropy=torch.tensor([[5.0, 0.1]]),
    )
    loose = get_method("gmts", rho=0.5)(stats, RuleState(trainer=TRAINER))
    tight = get_method("gmts", rho=0.5)(
        stats, RuleState(trainer=TrainerValues(**{**vars(TRAINER), "epsilon_high": 0.2}))
    )
    assert loose.weights.tolist() == [[1.0, 0.0]] and tight.weights.tolist() == [[0.0, 1.0]]


@pytest.mark.parametrize(
    "kw, trainer, message",
    [
        (
            dict(beta=0.1),
            dict(beta=0.0),
            "rule 'gmts': beta=0.1 but trainer.beta=0.0 (leave it unset to use the trainer's)",
        ),
        (dict(eps_high=0.2), dict(), "rule 'gmts': eps_high=0.2 but trainer.epsilon_high=0.28 (leave it unset"),
        (dict(eps_low=0.1), dict(), "rule 'gmts': eps_low=0.1 but trainer.epsilon_low=0.2"),
    ],
)
def test_check_trainer_names_the_disagreement(kw, trainer, message):
    values = TrainerValues(**{**vars(TRAINER), **trainer})
    with pytest.raises(ValueError) as e:
        get_method("gmts", **kw).check_trainer(values)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    get_method("gmts", eps_low=0.2, eps_high=0.28, beta=0.0).check_trainer(TRAINER)  # agreeing values pass
    get_method("gmts").check_trainer(values)


def test_trainer_values_from_config():
    from dataclasses import make_dataclass

    from omegaconf import OmegaConf

    keys = {
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "beta": 0.0,
        "loss_type": "dapo",
        "num_generations": 8,
        "learning_rate": 1e-6,
    }  # other trainer keys are ignored
    want = TrainerValues(epsilon_low=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo", num_generations=8)
    assert TrainerValues.from_config(OmegaConf.create(keys)) == want
    assert TrainerValues.from_config(make_dataclass("T", list(keys))(**keys)) == want
    d = {"epsilon": 0.1, "epsilon_high": None, "beta": 0.04, "loss_type": "grpo", "num_generations": 4}
    assert TrainerValues.from_config(d) == TrainerValues(0.1, 0.1, 0.04, "grpo", 4)  # None: TRL uses ε_low


def test_a_reference_rule_sees_the_trainer_values():
    """random matched to gmts reads what gmts reads under this trainer (ref_logp only with β > 0)."""
    matched = get_method("random", match="position", reference="gmts")
    kl = TrainerValues(**{**vars(TRAINER), "beta": 0.04})
    assert matched.needs_for(TRAINER) == {"logp", "entropy", "old_logp"}
    assert matched.needs_for(kl) == {"logp", "entropy", "old_logp", "ref_logp"}
