#!/usr/bin/env python3
"""Writes minimalloc CSV plans of torchvision CNNs' activations (not project code).

Each model is built with weights=None, traced with torch.fx symbolic tracing and run once
through ShapeProp on a 1x3x224x224 float32 input, which records every node's output shape and
dtype. Each node that produces a tensor becomes one buffer:

  id     the fx node's name (in graph order)
  lower  the node's index in graph order (its producer runs at that time)
  upper  1 + the index of its last user (the output node counts as a user, so the result stays
         live to the end); a node with no user lives [index, index + 1)
  size   numel * element size, in bytes

The input placeholder is a buffer like any other; the graph's output node is not (it returns a
tensor that already is one, which its user keeps live to the end). Parameters are not buffers: torchvision
models read them inside call_module nodes, so they never appear as graph values. In-place
modules (ReLU(inplace=True)) still get an output buffer of their own: the plan is the graph's,
not eager PyTorch's aliasing. Nodes whose output is not a tensor (none in these models) are
skipped.

Usage: python scripts/make-cnn-plans.py OUT_DIR   (needs torch and torchvision)
"""

import sys
from pathlib import Path

import torch
import torchvision
from torch.fx import symbolic_trace
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

MODELS = {
    "resnet18": torchvision.models.resnet18,
    "resnet50": torchvision.models.resnet50,
    "mobilenet_v2": torchvision.models.mobilenet_v2,
    "mobilenet_v3_large": torchvision.models.mobilenet_v3_large,
    "mobilenet_v3_small": torchvision.models.mobilenet_v3_small,
}


def buffers_of(model: torch.nn.Module):
    model.eval()
    gm = symbolic_trace(model)
    torch.manual_seed(0)
    with torch.no_grad():
        ShapeProp(gm).propagate(torch.randn(1, 3, 224, 224, dtype=torch.float32))
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    rows = []
    for i, n in enumerate(nodes):
        meta = n.meta.get("tensor_meta")
        # The output node only returns its argument: that tensor is already a buffer.
        if n.op == "output" or not isinstance(meta, TensorMetadata):
            continue
        numel = 1
        for d in meta.shape:
            numel *= int(d)
        size = numel * torch.empty((), dtype=meta.dtype).element_size()
        users = [index[u] for u in n.users]
        upper = max(users) + 1 if users else i + 1
        rows.append((n.name, i, upper, size))
    return rows, len(nodes)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "sample-traces/plans")
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    for name, ctor in MODELS.items():
        rows, n_nodes = buffers_of(ctor(weights=None))
        path = out / f"{name}.csv"
        with path.open("w") as f:
            f.write("id,lower,upper,size\n")
            for r in rows:
                f.write(",".join(str(x) for x in r) + "\n")
        total = sum(r[3] for r in rows)
        print(f"{path}: {len(rows)} buffers over {n_nodes} nodes, {total} bytes in all")


if __name__ == "__main__":
    main()
