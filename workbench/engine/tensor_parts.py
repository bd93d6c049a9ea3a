"""The plain (strided) tensors a tensor's data lives in: itself, or a sparse tensor's index and value tensors.

A sparse tensor has no storage of its own: `untyped_storage()` raises NotImplementedError. A GCN keeps its
normalized adjacency as a sparse buffer (pytorch/examples' gcn, ported): its snapshot was written, and every resume
of it failed, because the resume asked each loaded tensor for its storage. What walks storages walks these parts
(the resume's mapped pages, a payload's bytes, the leak finder's owners).
"""

from __future__ import annotations

import torch


def strided_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """`[tensor]` for a plain tensor; a sparse one's indices and values (COO, CSR, CSC, BSR, BSC)."""
    layout = tensor.layout
    if layout == torch.strided:
        return [tensor]
    if layout == torch.sparse_coo:
        return [tensor._indices(), tensor._values()]
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    return []  # a layout with no parts to walk (jagged, mkldnn): nothing of it is counted or mapped
