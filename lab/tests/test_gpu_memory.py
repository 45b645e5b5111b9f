"""lab/gpu_memory.py on the CPU at the tiny shape: the parameters a LoRA probe trains, what
--layers builds, and full fine-tuning training every weight; the KL exactly 0 at step 0."""
import json

import pytest

from lab import gpu_memory

TINY = gpu_memory.SHAPES["tiny"]


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """The figures of one update each: (LoRA rank, layers) -> the probe's JSON."""
    out = tmp_path_factory.mktemp("memory")
    figures = {}
    for rank, layers in ((4, 2), (0, 2), (0, 3)):
        path = out / f"lora{rank}-layers{layers}.json"
        gpu_memory.main(["tiny", "--dry", "--lora", str(rank), "--layers", str(layers),
                         "--updates", "1", "--json", str(path)])
        figures[rank, layers] = json.load(open(path))
    return figures


def projections(shape):
    """(in_features, out_features) of one layer's q, k, v, o, gate, up and down projections."""
    hidden, mlp = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * hidden // shape["num_attention_heads"]
    return [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden),
            (hidden, mlp), (hidden, mlp), (mlp, hidden)]


def test_lora_trains_a_rank_r_pair_on_every_projection(probes):
    lora, full = probes[4, 2], probes[0, 2]
    # A is rank x in, B is out x rank, on each of the 7 projections of each layer
    assert lora["trainable_params"] == 4 * 2 * sum(i + o for i, o in projections(TINY))
    # the base is the same model, the adapter added beside it
    assert lora["params"] - lora["trainable_params"] == full["params"]
    assert lora["lora_rank"] == 4 and lora["layers"] == 2


def test_layers_builds_that_many_qwen2_layers(probes):
    hidden, (_, kv) = TINY["hidden_size"], projections(TINY)[1]     # kv: k's output width
    # every projection's weight, q, k and v's biases, and the two RMSNorms' weights
    layer = sum(i * o for i, o in projections(TINY)) + hidden + 2 * kv + 2 * hidden
    assert probes[0, 3]["layers"] == 3
    assert probes[0, 3]["params"] - probes[0, 2]["params"] == layer


def test_full_fine_tuning_trains_every_weight(probes):
    for rank, layers in ((0, 2), (0, 3)):
        assert probes[rank, layers]["trainable_params"] == probes[rank, layers]["params"]
        assert probes[rank, layers]["lora_rank"] == 0


def test_every_probe_starts_at_kl_0_with_finite_losses(probes):
    for figures in probes.values():
        assert figures["kl_step0"] == 0.0 and figures["finite_loss"]
        assert figures["episodes"] == 4 and len(figures["update_s"]) == 1
        assert figures["peak_rss_gb"] > 0
