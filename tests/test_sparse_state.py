"""A sparse tensor in the state (a GCN's normalized adjacency as a buffer) is snapshotted and resumed.

pytorch/examples' gcn, ported: the snapshot was written with nothing left out, and every resume of it failed
(`Cannot access storage of SparseTensorImpl`) because the resume asked each loaded tensor for its storage.
"""

from __future__ import annotations

from pathlib import Path

import torch

from conftest import is_event, make_project, open_session, snapshot_after
from workbench.engine.actions.snapshot_integrity import payload_bytes

GCN = """\
import torch

torch.manual_seed(0)
NODES = 40
edges = torch.randint(0, NODES, (2, 120))
ADJ = torch.sparse_coo_tensor(edges, torch.rand(120), (NODES, NODES)).coalesce()
FEATURES = torch.randn(NODES, 5)
LABELS = torch.randint(0, 3, (NODES,))


class GCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("adj", ADJ)
        self.first = torch.nn.Linear(5, 8)
        self.second = torch.nn.Linear(8, 3)

    def forward(self, x):
        x = torch.relu(torch.sparse.mm(self.adj, self.first(x)))
        return torch.sparse.mm(self.adj, self.second(torch.dropout(x, 0.5, self.training)))


def setup(bench):
    model = GCN()
    return {"model": model, "opt": torch.optim.Adam(model.parameters(), lr=0.01)}


def step(state, bench):
    loss = torch.nn.functional.cross_entropy(state["model"](FEATURES), LABELS)
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    return loss
"""


def test_a_sparse_buffer_is_resumed_and_the_run_goes_on_as_the_one_that_never_stopped(tmp_path: Path) -> None:
    snapshot = snapshot_after(tmp_path, GCN, 3)
    root = make_project(tmp_path, {"train.py": GCN}, folder="straight")
    with open_session(root / "train.py", max_steps=6, exit_at_max_steps=False) as live:
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        straight = [e.loss for e in live.events.of("step")][3:]
    root = make_project(tmp_path, {"train.py": GCN}, folder="resumed")
    with open_session(root / "train.py", resume=snapshot, max_steps=6, exit_at_max_steps=False) as live:
        resumed = live.wait_for(is_event("resume"), timeout=60)
        assert resumed.ok and resumed.tensors == 5, resumed
        live.wait_for(is_event("paused", reason="max steps"), timeout=60)
        assert [e.loss for e in live.events.of("step")] == straight
        assert live.session.worker.user_state["model"].adj.is_sparse


def test_a_sparse_tensor_counts_its_indices_and_values_not_its_dense_size() -> None:
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 999], [5, 999]]), torch.ones(2), (1000, 1000)).coalesce()
    assert payload_bytes({"adj": sparse}) == 2 * 2 * 8 + 2 * 4  # int64 indices (2 x 2) and two float32 values
    csr = sparse.to_sparse_csr()
    assert 1001 * 8 + 2 * 8 + 2 * 4 <= payload_bytes([csr]) < 10_000, "its parts' storages, not 4 MB of dense floats"
