"""The conv stem's CUDA inference path (each convolution as one matrix product over its windows,
`ConvStem.forward_as_matmuls`) equals the convolutions it replaces, chunk by chunk with the carried
state, as the whole clip at once. (On the CPU, `forward` itself keeps the convolutions.)"""

from __future__ import annotations

import pytest
import torch

from realtime.model import ConvStem


@pytest.mark.parametrize("chunks", [[8], [2, 2, 4, 8], [16, 2]])
def test_inference_stem_equals_the_convolutions_in_any_chunking(chunks: list[int]) -> None:
    torch.manual_seed(0)
    stem = ConvStem(16, 24).double()
    mel = torch.randn(3, 16, sum(chunks), dtype=torch.float64)
    with torch.enable_grad():  # the training path: nn.Conv1d over the whole clip
        whole, (w1, w2) = stem(mel, stem.initial_state(3, torch.device("cpu"), torch.float64))
    state = stem.initial_state(3, torch.device("cpu"), torch.float64)
    outs, start = [], 0
    with torch.no_grad():
        for n in chunks:
            y, state = stem.forward_as_matmuls(torch.cat([state[0], mel[..., start: start + n]], dim=-1), state[1])
            outs.append(y)
            start += n
    assert torch.allclose(torch.cat(outs, dim=1), whole.detach(), atol=1e-12, rtol=0)
    assert torch.equal(state[0], w1) and torch.allclose(state[1], w2.detach(), atol=1e-12, rtol=0)
    assert state[1].shape == (3, 24, 1) and whole.shape == (3, sum(chunks) // 2, 24)
