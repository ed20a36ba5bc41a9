"""Bayesian regression as Pyro's tutorial writes it: a ``PyroModule`` model whose weights are
``PyroSample`` priors (no parameter of its own), a guide of ``pyro.param`` statements (tensors of
Pyro's parameter store, which no module owns), trained by ``SVI`` with ``pyro.optim.Adam`` (one
torch optimizer per parameter). The model runs through ``model(x)`` (Pyro's handlers call it)."""

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer import SVI, Trace_ELBO
from pyro.nn import PyroModule, PyroSample
from torch import nn


class BayesianRegression(PyroModule):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = PyroModule[nn.Linear](in_features, out_features)
        self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([out_features, in_features]).to_event(2))
        self.linear.bias = PyroSample(dist.Normal(0.0, 10.0).expand([out_features]).to_event(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        sigma = pyro.sample("sigma", dist.Uniform(0.0, 10.0))
        mean = self.linear(x).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mean, sigma), obs=y)
        return mean


def guide(x: torch.Tensor, y: torch.Tensor | None = None) -> None:
    weight_loc = pyro.param("weight_loc", torch.zeros(1, 3))
    weight_scale = pyro.param("weight_scale", torch.ones(1, 3), constraint=constraints.positive)
    bias_loc = pyro.param("bias_loc", torch.zeros(1))
    sigma_loc = pyro.param("sigma_loc", torch.tensor(1.0), constraint=constraints.positive)
    pyro.sample("linear.weight", dist.Normal(weight_loc, weight_scale).to_event(2))
    pyro.sample("linear.bias", dist.Normal(bias_loc, 0.05).to_event(1))
    pyro.sample("sigma", dist.Normal(sigma_loc, 0.05))


pyro.set_rng_seed(0)
x_data = torch.randn(100, 3)
y_data = x_data @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(100)
model = BayesianRegression(3, 1)
pyro.clear_param_store()
svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.03}), loss=Trace_ELBO())
for step in range(10):
    loss = svi.step(x_data, y_data)
print("done")
