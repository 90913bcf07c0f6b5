"""An image classifier that takes images of any size, as torchvision's and
Hugging Face's convolutional models do: every size a client sends runs
compiled code, for as long as that size takes (tests/hostile). Captured
with --max-size, its variants take images up to 256x256 and the server
refuses larger ones before any code runs."""

import torch


class AnySizeClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
        self.classes = torch.nn.Linear(8, 10)

    def forward(self, images):
        return self.classes(self.features(images).flatten(1))


def make_classifier() -> AnySizeClassifier:
    return AnySizeClassifier().eval()
