"""Pyro's variational autoencoder as ``examples/vae/vae.py`` writes it (``SVI`` with ``Trace_ELBO`` and
``pyro.optim.Adam``, a ``PyroOptim`` that builds one torch Adam per parameter inside ``svi.step``), small.

By default the decoder is registered with ``pyro.module("decoder", ...)`` once in ``__init__``, outside the
model: SVI steps only the parameters whose sites run inside the model or the guide, so the decoder gets
gradients and never changes. ``--in-model``: registered inside the model, as the example does."""

import sys

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import Adam
from torch import nn

D = 16  # 784 in the example


class Encoder(nn.Module):
    def __init__(self, z_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, hidden_dim)
        self.fc21 = nn.Linear(hidden_dim, z_dim)
        self.fc22 = nn.Linear(hidden_dim, z_dim)
        self.softplus = nn.Softplus()

    def forward(self, x):
        hidden = self.softplus(self.fc1(x.reshape(-1, D)))
        return self.fc21(hidden), torch.exp(self.fc22(hidden))


class Decoder(nn.Module):
    def __init__(self, z_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(z_dim, hidden_dim)
        self.fc21 = nn.Linear(hidden_dim, D)
        self.softplus = nn.Softplus()

    def forward(self, z):
        return torch.sigmoid(self.fc21(self.softplus(self.fc1(z))))


class VAE(nn.Module):
    def __init__(self, in_model: bool, z_dim: int = 4, hidden_dim: int = 8) -> None:
        super().__init__()
        self.encoder = Encoder(z_dim, hidden_dim)
        self.decoder = Decoder(z_dim, hidden_dim)
        self.in_model = in_model
        if not in_model:
            pyro.module("decoder", self.decoder)  # the mistake: registered once here, not inside model()
        self.z_dim = z_dim

    def model(self, x):
        if self.in_model:
            pyro.module("decoder", self.decoder)
        with pyro.plate("data", x.shape[0]):
            z_loc = torch.zeros(x.shape[0], self.z_dim, dtype=x.dtype, device=x.device)
            z_scale = torch.ones(x.shape[0], self.z_dim, dtype=x.dtype, device=x.device)
            z = pyro.sample("latent", dist.Normal(z_loc, z_scale).to_event(1))
            loc_img = self.decoder.forward(z)
            pyro.sample("obs", dist.Bernoulli(loc_img, validate_args=False).to_event(1), obs=x.reshape(-1, D))
            return loc_img

    def guide(self, x):
        pyro.module("encoder", self.encoder)
        with pyro.plate("data", x.shape[0]):
            z_loc, z_scale = self.encoder.forward(x)
            pyro.sample("latent", dist.Normal(z_loc, z_scale).to_event(1))


pyro.clear_param_store()
pyro.set_rng_seed(0)
vae = VAE(in_model="--in-model" in sys.argv[1:])
optimizer = Adam({"lr": 1.0e-3})
svi = SVI(vae.model, vae.guide, optimizer, loss=Trace_ELBO())
x = torch.bernoulli(torch.full((8, D), 0.3))
for step in range(4):
    loss = svi.step(x)
print("done")
