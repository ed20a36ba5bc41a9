"""A model whose base class defines its own ``__call__`` that runs ``self.forward`` directly, as gpytorch's
``gpytorch.Module.__call__`` (``gpytorch/module.py``) does for every gpytorch model, kernel, mean and likelihood:
torch's module hooks never see them run. Rebuilt in plain torch: an exact GP regression with a constant mean,
a scaled RBF kernel and a Gaussian likelihood, trained on the negative marginal log likelihood, the script
calling ``model(train_x)`` as gpytorch's tutorials do.

With ``--unused-parameter`` the mean registers an ``offset`` its forward never uses: the bug beside it."""

import math
import sys

import torch
from torch import nn


class Module(nn.Module):
    def __call__(self, *inputs, **kwargs):
        return self.forward(*inputs, **kwargs)


class ConstantMean(Module):
    def __init__(self) -> None:
        super().__init__()
        self.constant = nn.Parameter(torch.zeros(()))
        if "--unused-parameter" in sys.argv:
            self.offset = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.constant.expand(x.shape[0])


class ScaleRBFKernel(Module):
    def __init__(self) -> None:
        super().__init__()
        self.raw_lengthscale = nn.Parameter(torch.zeros(()))
        self.raw_outputscale = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        lengthscale, outputscale = nn.functional.softplus(self.raw_lengthscale), nn.functional.softplus(self.raw_outputscale)
        return outputscale * torch.exp(-0.5 * torch.cdist(x[:, None], x[:, None]).pow(2) / lengthscale ** 2)


class GaussianLikelihood(Module):
    def __init__(self) -> None:
        super().__init__()
        self.raw_noise = nn.Parameter(torch.zeros(()))

    def forward(self, mean, covar):
        noise = nn.functional.softplus(self.raw_noise) + 1e-4
        return torch.distributions.MultivariateNormal(mean, covar + noise * torch.eye(len(mean)))


class ExactGPModel(Module):
    def __init__(self, likelihood: GaussianLikelihood) -> None:
        super().__init__()
        self.likelihood = likelihood
        self.mean_module = ConstantMean()
        self.covar_module = ScaleRBFKernel()

    def forward(self, x):
        return self.mean_module(x), self.covar_module(x)


torch.manual_seed(0)
train_x = torch.linspace(0, 1, 20)
train_y = torch.sin(train_x * (2 * math.pi)) + 0.1 * torch.randn(20)
likelihood = GaussianLikelihood()
model = ExactGPModel(likelihood)
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
for i in range(5):
    optimizer.zero_grad()
    output = likelihood(*model(train_x))
    loss = -output.log_prob(train_y) / len(train_y)
    loss.backward()
    optimizer.step()
print("done")
