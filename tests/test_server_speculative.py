"""The service with a drafter (`--drafter`): transcripts unchanged, speculation counted on /metrics."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_server_common import (  # noqa: F401  (fixtures)
    MODEL,
    ckpt,
    clip,
    engine,
    fresh_vllm_utterance,
    reference,
    start_server,
)
from test_server_robustness import http_get
from test_speculative import echo_drafter

from realtime.model_store import load_model_and_tokenizer
from speculative.drafter import EagleDrafter, ParallelEagleDrafter, TwoPassEagleDrafter, save_drafter
from stream_server.engine_factory import build_engine


@pytest.mark.parametrize(("cls", "trained_for", "k"), [(EagleDrafter, None, 4), (ParallelEagleDrafter, None, 6),
                                                       (TwoPassEagleDrafter, None, 6), (ParallelEagleDrafter, 3, 3),
                                                       (ParallelEagleDrafter, 10, 6)])
def test_the_drafters_kind_sets_the_default_number_of_drafts(ckpt, tmp_path, cls, trained_for, k):
    """`--num-speculative-tokens` left out: the drafts a drafter's config says it was trained for, at most 6 on the
    CPU; for a drafter that does not say, 4 if chained, 6 if parallel or two-pass. A count its config records for
    GPUs (`gpu_draft_tokens`, 12 here) does not reach a CPU engine."""
    model, _ = load_model_and_tokenizer(ckpt)
    drafter = echo_drafter(model, cls=cls)
    drafter.config = dataclasses.replace(drafter.config, draft_tokens=trained_for, gpu_draft_tokens=12)
    save_drafter(drafter, tmp_path / "drafter")
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "drafter"))
    assert eng.speculator.k == k
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "drafter"),
                       num_speculative_tokens=3)
    assert eng.speculator.k == 3
    # more drafts than a plain step's 8 rows (the shipped drafter's 10 on a GPU): the runner is sized for the verify
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "drafter"),
                       num_speculative_tokens=10)
    assert eng.speculator.k == 10 and eng.opts.max_step_tokens == 11


def test_tree_verification_settings_in_the_engine_factory(ckpt, tmp_path):
    """`--tree-nodes M`: a tree of M drafts for a parallel drafter; refused without a drafter or with a
    chained one, before the service starts."""
    model, _ = load_model_and_tokenizer(ckpt)
    save_drafter(echo_drafter(model, cls=ParallelEagleDrafter), tmp_path / "parallel")
    save_drafter(echo_drafter(model), tmp_path / "chained")
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "parallel"),
                       tree_nodes=12)
    assert len(eng.speculator.tree.paths) == 12 and eng.speculator.verify_rows == 13
    assert eng.speculator.cfg.tree_max_streams == 1  # by default the tree only when one stream drafts
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "parallel"),
                       tree_nodes=12, tree_max_streams=None)
    assert eng.speculator.cfg.tree_max_streams is None
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "parallel"))
    assert eng.speculator.tree is None and eng.speculator.cfg.tree_max_streams is None
    from stream_server.app import build_parser

    assert build_parser().parse_args(["--tree-nodes", "24", "--tree-max-streams", "3"]).tree_max_streams == 3
    assert build_parser().parse_args([]).tree_max_streams == 1
    with pytest.raises(ValueError, match="needs --drafter"):
        build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, tree_nodes=12)
    with pytest.raises(ValueError, match="needs a parallel drafter"):
        build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "chained"),
                     tree_nodes=12)


def test_verify_rows_cap_in_the_engine_factory(ckpt, tmp_path):
    """`--max-verify-rows R`: the engine's cap on a step's verify rows (default 32 on the CPU); refused without a
    drafter, and a cap below 1 is refused by the command line before the service starts."""
    from stream_server.app import build_parser

    model, _ = load_model_and_tokenizer(ckpt)
    save_drafter(echo_drafter(model, cls=ParallelEagleDrafter), tmp_path / "parallel")
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "parallel"))
    assert eng.speculator.cfg.max_verify_rows == 32
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "parallel"),
                       max_verify_rows=40)
    assert eng.speculator.cfg.max_verify_rows == 40
    with pytest.raises(ValueError, match="--max-verify-rows needs --drafter"):
        build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, max_verify_rows=40)
    assert build_parser().parse_args(["--max-verify-rows", "24"]).max_verify_rows == 24
    assert build_parser().parse_args([]).max_verify_rows is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-verify-rows", "0"])


@pytest.mark.parametrize(("cls", "tree_nodes"), [(EagleDrafter, None), (ParallelEagleDrafter, None),
                                                 (ParallelEagleDrafter, 12)])
async def test_vllm_utterances_with_a_drafter(ckpt, tmp_path, start_server, reference, cls, tree_nodes):
    """A chained and a parallel drafter (`--drafter DIR`, its class from its checkpoint), k = 6; the
    parallel one also with tree verification (`--tree-nodes 12`)."""
    path = ckpt
    model, _ = load_model_and_tokenizer(path)
    save_drafter(echo_drafter(model, cls=cls), tmp_path / "drafter")
    eng = build_engine("batched", str(path), model_name=MODEL, max_streams=8, drafter=str(tmp_path / "drafter"),
                       num_speculative_tokens=6, tree_nodes=tree_nodes)
    assert eng.speculator.parallel is (cls is ParallelEagleDrafter)
    assert (eng.speculator.tree is not None) is (tree_nodes is not None)
    eng.start()
    try:
        srv = start_server(engine_override=eng)
        # unpaced audio (the vLLM example client sends everything at once): streams are backlogged
        for seed in (71, 72):
            audio = clip(2.0, seed=seed)
            assert await fresh_vllm_utterance(srv.ws_url, audio) == reference(audio)
        stats = eng.stats()
        assert stats.spec_drafted > 0  # the drafter really ran
        _, _, body = http_get(f"http://127.0.0.1:{srv.port}/metrics")
        text = body.decode()
        drafted = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("streamscribe_spec_drafted_tokens ")]
        assert drafted and drafted[0] > 0
        assert np.isfinite(stats.spec_accepted)
        # the mean acceptance length and the first draft depth's counts, as the engine counted them
        stats = eng.stats()
        _, _, body = http_get(f"http://127.0.0.1:{srv.port}/metrics")
        text = body.decode()
        mean = [float(ln.split()[-1]) for ln in text.splitlines()
                if ln.startswith("streamscribe_spec_mean_acceptance_length ")]
        assert mean and mean[0] >= 1.0 and mean[0] == pytest.approx(stats.spec_mean_acceptance_length)
        first = [float(ln.split()[-1]) for ln in text.splitlines()
                 if ln.startswith('streamscribe_spec_position_drafted_tokens{position="0"} ')]
        assert first == [stats.spec_drafted_per_position[0]] and first[0] > 0
    finally:
        eng.stop()


def test_encoder_stream_setting_in_the_engine_factory(ckpt, tmp_path):
    """`--no-encoder-stream` reaches the batched engine's runner options (the stream is on by default); a
    speculative engine keeps its encoder on the main stream either way."""
    from stream_server.app import build_parser

    assert build_parser().parse_args([]).no_encoder_stream is False
    assert build_parser().parse_args(["--no-encoder-stream"]).no_encoder_stream is True
    assert build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2).runner.opts.encoder_stream
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, encoder_stream=False)
    assert eng.runner.opts.encoder_stream is False and eng.runner.enc_stream is None
    model, _ = load_model_and_tokenizer(ckpt)
    save_drafter(echo_drafter(model, cls=ParallelEagleDrafter), tmp_path / "parallel")
    eng = build_engine("batched", str(ckpt), model_name=MODEL, max_streams=2, drafter=str(tmp_path / "parallel"))
    assert eng.runner.opts.encoder_stream is False
