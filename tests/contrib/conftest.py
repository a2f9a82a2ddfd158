"""The torch tests share a busy 2-core machine: one intra-op thread each (as the launcher gives services)."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
