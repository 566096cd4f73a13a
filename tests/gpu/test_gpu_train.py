"""Training on the GPU: bf16 against the fp32 CPU run, resume, FSDP2 on one GPU, compile,
export-hf and eval, all through `tokenmill.cli.main` on data made from the repository's text.

Tolerances (losses are per-step means over a 16 x 128-token batch):
- bf16 on the device vs fp32 on the device and on the CPU, 200 steps (60 when the device is the
  CPU): the mean loss of the last 20 steps within BF16_RTOL (3%) relative, and the first step's
  loss within 1%: bf16 rounds weights' updates and activations, so curves drift apart slowly but
  stay close. Weights are drawn on the device they train on, so the CPU run starts from other
  (equally distributed) weights: fp32 on the device is held against both, which tells a
  precision effect (bf16 vs fp32, same weights) from a device one (fp32 vs fp32).
- the same precision and device with a different but equivalent layout (resumed, compiled):
  every step within SAME_RTOL (0.5%); kernels and reduction orders differ.
- FSDP2 with one shard against the same run without it: every step within SCHEME_RTOL (1%). Its
  bf16 is FSDP2's mixed precision (bf16 parameters everywhere, norms and embeddings included),
  the other's autocast (fp32 parameters, bf16 matmuls): two schemes, not one layout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from gpu_runs import DEVICE, ON_CUDA, train, train_config

BF16_RTOL = 0.03
FIRST_STEP_RTOL = 0.01
SAME_RTOL = 0.005
SCHEME_RTOL = 0.01
# Model shapes: `tiny` (gpt2) and `tiny-llama` train 200 steps in seconds on a CPU, so the fp32
# CPU reference is computed here; `small` (gpt2-125m's shape) is checked on CUDA only, against
# fp32 on the same device, since 200 fp32 steps of it take minutes on a CPU.
MODELS = {"tiny": {"preset": "tiny"}, "tiny-llama": {"preset": "tiny-llama"}}
# 200 steps on a GPU; 60 on the CPU (the dry run), where bf16 matmuls run ~5x slower than fp32.
BF16_STEPS = 200 if ON_CUDA else 60


def mean_last(values: list[float], n: int = 20) -> float:
    return sum(values[-n:]) / len(values[-n:])


@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_on_device_matches_fp32_on_cpu(name: str, gpu_data: dict[str, Path], tmp_path: Path) -> None:
    steps = BF16_STEPS
    fp32 = train_config(tmp_path / "fp32.yaml", MODELS[name], steps=steps, precision="fp32")
    ref = train(fp32, gpu_data["shard"], tmp_path / "cpu", "cpu")
    ref_device = ref if DEVICE == "cpu" else train(fp32, gpu_data["shard"], tmp_path / "dev-fp32", DEVICE)
    got = train(
        train_config(tmp_path / "bf16.yaml", MODELS[name], steps=steps, precision="bf16"),
        gpu_data["shard"],
        tmp_path / "dev",
        DEVICE,
    )
    assert len(ref) == len(ref_device) == len(got) == steps
    print(
        f"{name}: first step fp32 cpu {ref[0]:.4f}, fp32 {DEVICE} {ref_device[0]:.4f}, bf16 {DEVICE} {got[0]:.4f}; "
        f"last-20 mean fp32 cpu {mean_last(ref):.4f}, fp32 {DEVICE} {mean_last(ref_device):.4f}, "
        f"bf16 {DEVICE} {mean_last(got):.4f}"
    )
    assert got[0] == pytest.approx(ref[0], rel=FIRST_STEP_RTOL)
    assert mean_last(got) == pytest.approx(mean_last(ref_device), rel=BF16_RTOL)  # precision
    assert mean_last(ref_device) == pytest.approx(mean_last(ref), rel=BF16_RTOL)  # device
    assert mean_last(got) < got[0] - 0.5  # it learned


@pytest.mark.skipif(not ON_CUDA, reason="gpt2-125m's shape for 200 steps is a GPU check (minutes on a CPU)")
def test_bf16_small_model_matches_fp32(gpu_data: dict[str, Path], tmp_path: Path) -> None:
    model = {"preset": "gpt2-125m", "vocab_size": 1024}
    # GPT-2 small's own learning rate: 3e-3 (the tiny models') makes 125M spike, and spikes
    # land at different steps in bf16 and fp32.
    ref = train(
        train_config(tmp_path / "fp32.yaml", model, steps=200, precision="fp32", seq=256, lr=6e-4),
        gpu_data["shard"],
        tmp_path / "fp32",
        DEVICE,
    )
    got = train(
        train_config(tmp_path / "bf16.yaml", model, steps=200, precision="bf16", seq=256, lr=6e-4),
        gpu_data["shard"],
        tmp_path / "bf16",
        DEVICE,
    )
    print(f"gpt2-125m shape: last-20 mean fp32 {mean_last(ref):.4f}, bf16 {mean_last(got):.4f}")
    assert got[0] == pytest.approx(ref[0], rel=FIRST_STEP_RTOL)
    assert mean_last(got) == pytest.approx(mean_last(ref), rel=BF16_RTOL)


@pytest.fixture(scope="module")
def device_run(gpu_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    """40 bf16 steps of tiny on the device, straight through: the reference of the layout checks,
    and the run that export-hf and eval read."""
    root = tmp_path_factory.mktemp("device-run")
    config = train_config(root / "bf16.yaml", MODELS["tiny"], steps=40, precision="bf16")
    return root / "run", train(config, gpu_data["shard"], root / "run", DEVICE)


def test_resume_gives_the_same_losses(device_run, gpu_data: dict[str, Path], tmp_path: Path) -> None:
    _, straight = device_run
    config = train_config(tmp_path / "bf16.yaml", MODELS["tiny"], steps=40, precision="bf16")
    first = train(config, gpu_data["shard"], tmp_path / "run", DEVICE, "--steps", "20")
    assert len(first) == 20
    resumed = train(config, gpu_data["shard"], tmp_path / "run", DEVICE, "--resume")
    assert len(resumed) == 40
    assert resumed == pytest.approx(straight, rel=SAME_RTOL)


def test_fsdp2_one_shard_gives_the_same_losses(device_run, gpu_data: dict[str, Path], tmp_path: Path) -> None:
    _, straight = device_run
    config = train_config(tmp_path / "bf16.yaml", MODELS["tiny"], steps=40, precision="bf16", dp=1, zero=3)
    assert train(config, gpu_data["shard"], tmp_path / "run", DEVICE) == pytest.approx(straight, rel=SCHEME_RTOL)


def test_compile_gives_the_same_losses(device_run, gpu_data: dict[str, Path], tmp_path: Path) -> None:
    _, straight = device_run
    config = train_config(tmp_path / "bf16.yaml", MODELS["tiny"], steps=40, precision="bf16", compile=True)
    assert train(config, gpu_data["shard"], tmp_path / "run", DEVICE) == pytest.approx(straight, rel=SAME_RTOL)


def test_export_hf_from_a_device_run_matches_transformers(
    device_run, gpu_data: dict[str, Path], tmp_path: Path
) -> None:
    import torch
    import transformers

    from tokenmill.cli import main
    from tokenmill.train.checkpoint import load_for_inference

    run, _ = device_run
    assert main(["export-hf", str(run), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    ours, cfg, _ = load_for_inference(run, DEVICE)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).to(DEVICE).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = (Path(__file__).parents[2] / "README.md").read_text()
    ids = torch.tensor(tokenizer(text)["input_ids"][: 2 * 128], device=DEVICE).view(2, 128)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # true fp32, not TF32, for the exact comparison
    try:
        with torch.no_grad():
            theirs = hf(input_ids=ids).logits
            exact = (theirs - ours(ids)).abs().max().item()
            with torch.autocast(DEVICE.split(":")[0], dtype=torch.bfloat16):
                bf16 = (hf(input_ids=ids).logits.float() - ours(ids).float()).abs().max().item()
    finally:
        torch.set_float32_matmul_precision(precision)
    scale = theirs.abs().max().item()
    print(f"max |logit| {scale:.2f}; max |logit difference|: fp32 {exact:.2e}, bf16 autocast {bf16:.2e}")
    assert exact < 1e-3
    # bf16 keeps 8 bits of mantissa (2^-8 relative per rounding); two implementations that round
    # at different places land within a few percent of the largest logit.
    assert bf16 < 0.03 * scale


def test_eval_on_device_matches_cpu(device_run, gpu_data: dict[str, Path], tmp_path: Path) -> None:
    from tokenmill.cli import main

    run, _ = device_run
    results = {}
    for device in dict.fromkeys(["cpu", DEVICE]):
        out = tmp_path / f"{device.replace(':', '')}.json"
        argv = ["eval", "--model", str(run), "--tasks", "lambada_openai", "--data-dir", str(gpu_data["eval"])]
        assert main([*argv, "--device", device, "--bootstrap-iters", "0", "--output", str(out)]) == 0
        results[device] = json.loads(out.read_text())
    cpu, dev = (scores(results[d]) for d in ("cpu", DEVICE))
    print(f"eval on cpu: {cpu}; on {DEVICE}: {dev}")
    assert dev.keys() == cpu.keys() and len(cpu) >= 2
    # The same fp32 weights on both; the GPU's kernels (TF32 matmuls where enabled) move a
    # token's log-likelihood by up to ~1e-3 nats: perplexities are compared as mean log-likelihoods
    # (within 0.01 nats), accuracies within two documents that flip.
    n = results["cpu"]["results"][0]["n"]
    for key, value in cpu.items():
        if key.endswith("/perplexity"):
            assert math.log(dev[key]) == pytest.approx(math.log(value), abs=0.01), key
        else:
            assert dev[key] == pytest.approx(value, abs=2 / n), key


def scores(output: dict) -> dict[str, float]:
    """task/shots/metric -> value, from `tokenmill eval --output`'s JSON."""
    return {f"{r['task']}/{r['shots']}/{r['metric']}": r["value"] for r in output["results"]}
