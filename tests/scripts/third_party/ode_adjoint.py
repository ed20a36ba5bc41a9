"""torchdiffeq's adjoint method as its ``examples/ode_demo.py --adjoint`` uses it (``from torchdiffeq import
odeint_adjoint as odeint``, spiral data, RMSprop, mean absolute error), on a small latent ODE.

By default the dynamics network ``net`` is registered in the model but not in the module handed to
``odeint_adjoint`` (a wrapper around the model's method): ``odeint_adjoint`` collects the parameters of
the module it integrates, ``OdeintAdjointMethod.apply`` is not given ``net``'s, and ``net`` gets no
gradient while the encoder and decoder train. ``--registered``: the module integrated registers ``net``
(every tensor trains)."""

import sys

import torch
from torch import nn
from torchdiffeq import odeint_adjoint as odeint

TRUE_A = torch.tensor([[-0.1, 2.0], [-2.0, -0.1]])


class Lambda(nn.Module):
    def forward(self, t, y):
        return torch.mm(y**3, TRUE_A)


class ODEFunc(nn.Module):
    """odeint_adjoint integrates an nn.Module: this one wraps a function (or registers a network)."""

    def __init__(self, f) -> None:
        super().__init__()
        self.f = f

    def forward(self, t, y):
        return self.f(t, y) if not isinstance(self.f, nn.Module) else self.f(y)


class LatentODE(nn.Module):
    def __init__(self, registered: bool, latent: int = 4) -> None:
        super().__init__()
        self.encoder = nn.Linear(2, latent)
        self.net = nn.Sequential(nn.Linear(latent, 16), nn.Tanh(), nn.Linear(16, latent))
        self.decoder = nn.Linear(latent, 2)
        self.func = ODEFunc(self.net) if registered else None

    def dynamics(self, t, z):
        return self.net(z)

    def forward(self, y0, t):
        z0 = self.encoder(y0)
        zt = odeint(self.func if self.func is not None else ODEFunc(self.dynamics), z0, t, method="rk4")
        return self.decoder(zt)


def train(args: list[str], attach=None):
    """Four training steps; ``attach(model, optimizer)`` is called right after both are built (a test's Monitor)."""
    torch.manual_seed(0)
    data_size, batch_time, batch_size = 40, 5, 4
    t = torch.linspace(0.0, 2.0, data_size)
    with torch.no_grad():
        true_y = odeint(Lambda(), torch.tensor([[2.0, 0.0]]), t, method="rk4")
    model = LatentODE(registered="--registered" in args)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    monitor = attach(model, optimizer) if attach is not None else None
    for _ in range(4):
        optimizer.zero_grad()
        s = torch.randperm(data_size - batch_time)[:batch_size]
        batch_y = torch.stack([true_y[s + i] for i in range(batch_time)], dim=0)
        pred_y = model(true_y[s], t[:batch_time])
        loss = torch.mean(torch.abs(pred_y - batch_y))
        loss.backward()
        optimizer.step()
    print("done")
    return monitor


if __name__ == "__main__":
    train(sys.argv[1:])
