"""A recommender's pooled embeddings, called as DLRM-style models call
EmbeddingBag: one flat tensor of ids for the whole batch and the offset at
which each example's bag starts. Inductor compiles the bag's sum to a call
of ATen's kernel through AOTInductor's C shim, and the kernel sums between
offsets it does not check: unchecked, offsets of [0, -100000000, 3] ended the
process (runtime/kernel_input_checks.cc; tests/hostile)."""

import torch

ROWS = 50


class PooledEmbeddings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bags = torch.nn.EmbeddingBag(ROWS, 8, mode="sum")
        self.head = torch.nn.Linear(8, 1)

    def forward(self, ids, offsets):
        return self.head(self.bags(ids, offsets))


def make_pooled_embeddings() -> PooledEmbeddings:
    return PooledEmbeddings().eval()
