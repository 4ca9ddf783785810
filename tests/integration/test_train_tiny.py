"""The draft-head training pipeline end to end on a tiny random 4-layer Llama (~30-60 s on CPU).

Stages prompts -> generate (through the engine) -> features -> train run for real; the trained
EAGLE-3 head must lower its loss and beat a random head's acceptance length in the engine.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from eagle_core import LLM, EngineConfig, SamplingParams, SpecConfig
from eagle_core.spec.draft_head import (
    Eagle3Head,
    draft_config_from_target,
    eagle3_layer_ids,
    save_draft_head,
)
from eagle_core.train import trainer as trainer_module
from eagle_core.train.config import TrainConfig, load_config
from eagle_core.train.features import run_features, shard_paths
from eagle_core.train.generate import load_responses, run_generate, run_prompts
from tests.models import make_tiny_tokenizer, tiny_config

SPEC = SpecConfig(num_draft_tokens=8, depth=4, top_k=2, max_batch=0)


@pytest.fixture(scope="module")
def tiny4_dir(tmp_path_factory) -> Path:
    """A tiny 4-layer Llama (EAGLE-3 fuses 3 target layers) whose next token depends on the
    current token only (attention and MLP outputs zeroed, as in tests/spec_helpers.py's bigram
    target), with an untied LM head drawn so that next-token distributions are peaked. Plain
    random weights give near-uniform noise that no head learns in a few dozen steps; this target
    is learnable in seconds, and an off-by-one in the training alignment would show up as low
    acceptance (the label would then depend on a token the head never sees)."""
    path = tmp_path_factory.mktemp("tiny4")
    tokenizer = make_tiny_tokenizer()
    config = tiny_config("llama", tokenizer)
    config.num_hidden_layers = 4
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight) * 0.3)
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_train_config(model_dir: Path, work: Path) -> TrainConfig:
    yaml_text = f"""
model: {model_dir}
dtype: float32
work_dir: {work}
num_threads: 2
prompts: {{num_prompts: 160, num_heldout: 16}}
generate: {{part_size: 72, max_tokens: 48, temperatures: [0.0], max_num_seqs: 32}}
corpus: {{enabled: false}}
features: {{shard_tokens: 4000, max_seq_len: 128, top_k: 4}}
trainer: {{draft_vocab_size: 256, ttt_steps: 2, epochs: 6, batch_tokens: 2048, lr: 0.003,
          warmup_steps: 5, save_every_steps: 20, max_seq_len: 128, bf16_autocast: false}}
"""
    path = work / "tiny.yaml"
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml_text)
    return load_config(str(path))


def mean_tau(model_dir: Path, head: Path, prompts: list[str]) -> float:
    llm = LLM(model=str(model_dir), dtype="float32", draft=str(head),
              config=EngineConfig(spec=SPEC))
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    steps = sum(o.spec.num_steps for o in outs)
    return sum(len(o.token_ids) for o in outs) / max(1, steps)


def train_recording_losses(cfg: TrainConfig) -> tuple[dict, list[float]]:
    """run_train, plus the step-0 loss of every training batch in order."""
    losses: list[float] = []
    original = trainer_module.ttt_loss

    def recording_loss(*args, **kwargs):
        loss, stats = original(*args, **kwargs)
        losses.append(stats[0][0])
        return loss, stats

    trainer_module.ttt_loss = recording_loss
    try:
        return trainer_module.run_train(cfg), losses
    finally:
        trainer_module.ttt_loss = original


def test_training_lowers_loss_and_beats_a_random_head(tiny4_dir, tmp_path):
    cfg = tiny_train_config(tiny4_dir, tmp_path / "work")
    rows = run_prompts(cfg)
    run_generate(cfg)
    run_features(cfg)
    assert shard_paths(cfg)
    num_shards = len(shard_paths(cfg))
    run_features(cfg)  # resumable: nothing left to capture, no new shard
    assert len(shard_paths(cfg)) == num_shards

    summary, losses = train_recording_losses(cfg)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, (first, last)

    trained = Path(cfg.work_dir) / "head"
    assert (trained / "config.json").exists()
    assert json.loads((trained / "training.json").read_text())["steps"] == summary["steps"]

    # a random head of the same shape, for comparison
    target = AutoModelForCausalLM.from_pretrained(tiny4_dir)
    config = draft_config_from_target(target.config)
    torch.manual_seed(1)
    random_head = Eagle3Head(config, target.get_input_embeddings(),
                             eagle3_layer_ids(target.config.num_hidden_layers), draft_vocab_size=256)
    random_head.set_draft_vocab(torch.arange(256))
    save_draft_head(random_head, str(tmp_path / "random"))

    _, heldout = rows[:-16], rows[-16:]
    llm = LLM(model=str(tiny4_dir), dtype="float32")
    prompts = [llm.engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=False)
        for r in heldout]
    tau_trained = mean_tau(tiny4_dir, trained, prompts)
    tau_random = mean_tau(tiny4_dir, tmp_path / "random", prompts)
    print(f"tau trained {tau_trained:.2f} random {tau_random:.2f}")
    assert tau_trained > tau_random + 0.3, (tau_trained, tau_random)

    # Validation metrics: the target's mass on the head's top-1 / top-3 tokens, bounded by a
    # perfect head's; by sampling temperature too (all answers here are greedy); and the
    # "validate" stage reproduces them from the saved head on the same held-out split.
    mass1, mass3 = summary["val_mass_top1_by_step"][0], summary["val_mass_top3_by_step"][0]
    assert 0 < mass1 <= mass3 <= summary["val_ceiling_top3_by_step"][0] + 1e-6
    assert mass1 <= summary["val_ceiling_top1_by_step"][0] + 1e-6
    assert set(summary["val_by_group"]) == {"T=0"}
    validated = trainer_module.run_validate(cfg)
    assert validated["val_mass_top3_by_step"] == pytest.approx(summary["val_mass_top3_by_step"], abs=0.02)
    assert (Path(cfg.work_dir) / "validation-head.json").exists()

    # On-policy answers (generate.draft): written with the trained head drafting every step,
    # each row says which tokens the head supplied, and features.missed_weight weighs the others.
    policy_cfg = dataclasses.replace(
        cfg, work_dir=str(tmp_path / "on-policy"),
        generate=dataclasses.replace(cfg.generate, draft=str(trained), max_prompts=24, part_size=24),
        features=dataclasses.replace(cfg.features, missed_weight=3.0))
    run_prompts(policy_cfg)
    run_generate(policy_cfg)
    answers = load_responses(policy_cfg)
    assert len(answers) == 24 and all(len(r["drafted"]) == r["num_tokens"] for r in answers)
    supplied = sum(sum(r["drafted"]) for r in answers)
    assert 0 < supplied < sum(r["num_tokens"] for r in answers), supplied
    run_features(policy_cfg)
    weights = torch.cat([load_file(p)["weights"] for p in shard_paths(policy_cfg)])
    assert (weights == 3.0).any() and (weights == 1.0).any()

    # The "lk" objective trains too: continued from the trained head, it keeps its acceptance.
    lk_cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, init_from=str(trained), output=str(tmp_path / "lk"), epochs=0.5, objective="lk"))
    lk_summary, _ = train_recording_losses(lk_cfg)
    assert lk_summary["objective"] == "lk"
    assert lk_summary["val_mass_top1_by_step"][0] > 0.8 * mass1, (lk_summary["val_mass_top1_by_step"], mass1)

    # Warm start (trainer.init_from): a run continued from the trained head starts at its loss,
    # not at a fresh head's, and keeps its draft vocabulary.
    warm_cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, init_from=str(trained), output=str(tmp_path / "warm"), epochs=0.5))
    warm_summary, warm_losses = train_recording_losses(warm_cfg)
    assert warm_summary["init_from"] == str(trained)
    assert len(warm_losses) >= 3 and max(warm_losses[:3]) < 0.5 * first, (warm_losses[:3], first)
    d2t = lambda path: load_file(str(path / "model.safetensors"))["d2t"]  # noqa: E731
    assert torch.equal(d2t(tmp_path / "warm"), d2t(trained))

    # Growing (trainer.num_layers above the warm start's): the two-layer head starts where the
    # trained one-layer head is, saves and serves as a two-layer head.
    grown_cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
        cfg.trainer, init_from=str(trained), output=str(tmp_path / "grown"), epochs=0.5,
        num_layers=2))
    _, grown_losses = train_recording_losses(grown_cfg)
    assert abs(grown_losses[0] - warm_losses[0]) < 1e-4, (grown_losses[0], warm_losses[0])
    assert json.loads((tmp_path / "grown" / "config.json").read_text())["num_hidden_layers"] == 2
    tau_grown = mean_tau(tiny4_dir, tmp_path / "grown", prompts)
    assert tau_grown > tau_random + 0.3, (tau_grown, tau_random)
