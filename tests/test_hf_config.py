"""`--model` takes a Hugging Face config.json or its folder, and `--seq-length` (issue 28): the released
configs of Llama 3 8B, Mixtral 8x7B, Qwen3-30B-A3B and DeepSeek-V3 (tests/fixtures/hf, sources in its
SOURCES.md) are the shipped presets' models, and predict what the presets predict."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click
import pytest

from tuner.cli import cli
from tuner.errors import SpecError, UsageError
from tuner.specs import load_model, make_workload

HF = Path(__file__).resolve().parent / "fixtures" / "hf"
#: fixture folder -> (the shipped preset of that model, the preset's sequence length, its global batch)
SAME = {"Meta-Llama-3-8B": ("llama3-8b", 8192, 512), "Mixtral-8x7B-v0.1": ("mixtral-8x7b", 4096, 256),
        "Qwen3-30B-A3B": ("qwen3-30b-a3b", 4096, 512), "DeepSeek-V3": ("deepseek-v3", 4096, 15360)}


def without_name(spec) -> dict:
    return {k: v for k, v in asdict(spec).items() if k not in ("name", "global_batch")}


@pytest.mark.parametrize("folder", sorted(SAME))
def test_a_released_config_is_the_shipped_presets_model(folder):
    preset, seq, _ = SAME[folder]
    for source in (HF / folder, HF / folder / "config.json"):       # the folder or the file
        m = load_model(str(source), seq)
        assert without_name(m) == without_name(load_model(preset)), folder
        assert m.name == f"{folder.lower()}-s{seq}" and m.global_batch is None


def predict_json(tuner, model: str, *extra: str, layout=("--tp", "2", "--pp", "2", "--micro-batch", "1")) -> dict:
    code, out, err = tuner("predict", "--model", model, "--cluster", "h100", "--nodes", "4", *layout, *extra,
                           "--format", "json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("folder,layout", [
    ("Meta-Llama-3-8B", ("--tp", "2", "--pp", "2", "--micro-batch", "1")),
    ("Mixtral-8x7B-v0.1", ("--tp", "1", "--pp", "2", "--ep", "8", "--micro-batch", "1")),
    ("Qwen3-30B-A3B", ("--tp", "1", "--pp", "2", "--ep", "8", "--micro-batch", "2")),
])
def test_predict_with_a_released_config_predicts_what_the_preset_predicts(tuner, folder, layout):
    preset, seq, batch = SAME[folder]
    hf = predict_json(tuner, str(HF / folder), "--seq-length", str(seq), "--global-batch", str(batch), layout=layout)
    shipped = predict_json(tuner, preset, layout=layout)
    assert hf == shipped and hf["samples_per_second"] > 0


def test_plan_with_a_config_ranks_as_the_preset_and_names_the_config_in_its_header(tuner):
    code, out, err = tuner("plan", "--model", str(HF / "Meta-Llama-3-8B"), "--seq-length", "8192",
                           "--global-batch", "512", "--cluster", "h100", "--nodes", "2", "--top", "3")
    assert code == 0, err
    code2, out2, _ = tuner("plan", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "2", "--top", "3")
    assert code2 == 0
    assert out.splitlines()[0].startswith("meta-llama-3-8b-s8192 on 2 x h100 node(s) = 16 GPUs, global batch 512")
    assert out2.splitlines()[0].startswith("llama3-8b on 2 x h100")
    untimed = [[line for line in o.splitlines()[1:] if "layouts/s" not in line] for o in (out, out2)]
    assert untimed[0] == untimed[1] and len(untimed[0]) > 4


def test_a_config_needs_the_sequence_length_and_batch_and_says_both_at_once(tuner):
    code, out, err = tuner("predict", "--model", str(HF / "Mixtral-8x7B-v0.1"), "--nodes", "1", "--tp", "1",
                           "--pp", "1", "--micro-batch", "1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--seq-length and --global-batch" in err and "Traceback" not in err


def write_config(tmp_path: Path, **cfg) -> str:
    folder = tmp_path / "My Model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def test_an_architecture_tuner_cannot_map_is_refused_with_the_keys_it_lacks(tuner, tmp_path):
    gpt2 = write_config(tmp_path, architectures=["GPT2LMHeadModel"], model_type="gpt2", n_layer=12, n_embd=768,
                        n_head=12, vocab_size=50257)
    code, out, err = tuner("predict", "--model", gpt2, "--seq-length", "1024", "--global-batch", "8", "--nodes", "1",
                           "--tp", "1", "--pp", "1", "--micro-batch", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "GPT2LMHeadModel" in err and "num_hidden_layers, hidden_size, num_attention_heads, intermediate_size" in err
    assert "vocab_size" not in err.split("lacks")[1]          # it has that one


def test_a_mapped_architecture_missing_a_key_names_it(tmp_path):
    cfg = json.loads((HF / "Mixtral-8x7B-v0.1" / "config.json").read_text())
    del cfg["num_local_experts"]
    with pytest.raises(SpecError, match="lacks num_local_experts"):
        load_model(write_config(tmp_path, **cfg), 4096)


def test_a_sliding_window_shorter_than_the_sequence_is_refused(tmp_path):
    # Mistral 7B v0.1 (huggingface.co/mistralai/Mistral-7B-v0.1 config.json): sliding_window 4096
    mistral = write_config(tmp_path, architectures=["MistralForCausalLM"], model_type="mistral", hidden_act="silu",
                           hidden_size=4096, intermediate_size=14336, max_position_embeddings=32768,
                           num_attention_heads=32, num_hidden_layers=32, num_key_value_heads=8, rope_theta=10000.0,
                           sliding_window=4096, tie_word_embeddings=False, vocab_size=32000)
    assert load_model(mistral, 4096).num_query_groups == 8
    with pytest.raises(SpecError, match="sliding_window 4096 < --seq-length 8192"):
        load_model(mistral, 8192)


def test_qwen2_and_qwen3_dense_configs_map(tmp_path):
    # Qwen2.5-7B (huggingface.co/Qwen/Qwen2.5-7B config.json) and Qwen3-8B (huggingface.co/Qwen/Qwen3-8B)
    q25 = load_model(write_config(tmp_path, architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
                                  hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                                  num_hidden_layers=28, num_key_value_heads=4, rope_theta=1000000.0,
                                  sliding_window=131072, use_sliding_window=False, tie_word_embeddings=False,
                                  vocab_size=152064), 4096)
    assert (q25.num_query_groups, q25.head_dim, q25.qk_layernorm) == (4, 128, False)
    assert 7.0e9 < q25.num_parameters < 7.7e9                     # Qwen2.5-7B: 7.61 B (its model card)
    q3 = load_model(write_config(tmp_path, architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
                                 head_dim=128, hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                                 num_hidden_layers=36, num_key_value_heads=8, rope_theta=1000000,
                                 tie_word_embeddings=False, vocab_size=151936), 4096)
    assert q3.qk_layernorm and q3.head_dim == 128 and 8.0e9 < q3.num_parameters < 8.4e9   # Qwen3-8B: 8.2 B


def test_seq_length_on_a_preset_is_its_own_model(tuner):
    w = make_workload("llama3-8b", 1, "h100", seq_length=4096)
    assert (w.model.seq_length, w.model.name) == (4096, "llama3-8b-s4096")
    assert make_workload("llama3-8b", 1, "h100", seq_length=8192).model.name == "llama3-8b"   # its own length
    short = predict_json(tuner, "llama3-8b", "--seq-length", "4096")
    full = predict_json(tuner, "llama3-8b")
    assert short["memory_gb"] < full["memory_gb"]


def test_seq_length_keeps_best_answers_apart(tuner):
    """A study at 4096 tokens answers `best --seq-length 4096`, not `best` at the preset's 8192."""
    code, _, err = tuner("search", "--model", "llama3-tiny", "--seq-length", "64", "--nodes", "1", "--cluster", "h100",
                         "--budget", "2", "--study", "short")
    assert code == 0, err
    code, out, err = tuner("best", "--model", "llama3-tiny", "--seq-length", "64", "--nodes", "1", "--cluster", "h100",
                           "--format", "json")
    assert code == 0, err
    assert json.loads(out)["study"] == "short"
    code, out, err = tuner("best", "--model", "llama3-tiny", "--nodes", "1", "--cluster", "h100", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["study"] is None                     # predicted: the 64-token study is another model


def test_launch_takes_seq_length_and_a_config(tuner, tmp_path):
    code, out, err = tuner("launch", "--model", str(HF / "Meta-Llama-3-8B"), "--seq-length", "4096", "--global-batch",
                           "256", "--cluster", "h100", "--nodes", "2", "--framework", "megatron-core", "--out",
                           str(tmp_path / "l"), "--train-iters", "10", "--mock-data")
    assert code == 0, err
    args = (tmp_path / "l" / "megatron_args.txt").read_text().split("\n")
    assert args[args.index("--seq-length") + 1] == "4096"
    assert args[args.index("--global-batch-size") + 1] == "256"


@pytest.mark.parametrize("command", ["predict", "plan", "search", "best", "launch"])
def test_every_command_that_takes_a_workload_takes_seq_length_and_global_batch(command):
    names = {p.name for p in cli.commands[command].params}
    assert {"seq_length", "global_batch", "model"} <= names, command
    ctx = click.Context(cli.commands[command], info_name=command)
    (opt,) = [p for p in cli.commands[command].params if p.name == "model"]
    assert "config.json" in opt.get_help_record(ctx)[1]


def test_a_study_toml_and_the_library_take_seq_length(tmp_path):
    from tuner.config import check, workload_of
    w = workload_of(check({"model": str(HF / "Qwen3-30B-A3B"), "seq_length": 2048, "global_batch": 64, "nodes": 1,
                           "cluster": "h100"}))
    assert (w.model.seq_length, w.model.num_experts, w.global_batch) == (2048, 128, 64)
    with pytest.raises(UsageError, match="--seq-length"):
        workload_of(check({"model": str(HF / "Qwen3-30B-A3B"), "global_batch": 64, "nodes": 1, "cluster": "h100"}))


def test_the_readme_examples_of_config_json_and_seq_length_run(tuner, monkeypatch):
    import shlex
    root = HF.parents[2]
    from tests.docs_pages import all_text
    lines = [line for line in all_text().splitlines()                # README and docs/ pages
             if line.startswith("tuner ") and "--seq-length" in line]
    assert len(lines) >= 2
    monkeypatch.chdir(root)
    for line in lines:
        args = shlex.split(line)[1:]
        code, out, err = tuner(*args)
        assert code == 0, (line, err)
        seq = args[args.index("--seq-length") + 1]
        assert f"-s{seq} on " in out.splitlines()[0], line          # the workload is run at the stated sequence


def test_a_folder_named_like_a_preset_without_a_config_stays_the_preset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama3-8b").mkdir()                          # e.g. a results folder named after the model
    assert load_model("llama3-8b").name == "llama3-8b"
    with pytest.raises(SpecError, match="holds no config.json"):
        load_model("./llama3-8b", 4096)
