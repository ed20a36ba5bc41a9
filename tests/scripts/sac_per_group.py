"""SAC with one optimizer per loss group, as torchrl writes it (``torchrl/objectives/sac.py``'s ``SACLoss`` and
``sota-implementations/sac/utils.py``'s ``make_sac_optimizer``), rebuilt in plain torch. The loss module takes the
actor's parameters as they are, registers ``num_qvalue_nets`` fresh copies of the Q-network's parameters
(``convert_to_functional(..., expand_dim=2)``: new Parameters, re-drawn uniformly), their target copies and
``log_alpha``, and calls the Q-network functionally with each copy. The actor's optimizer is built before the loss
module, the Q-value and alpha optimizers after it, from its parameter groups; one backward of the summed losses,
then each group's optimizer steps.

With ``--forget-alpha`` the alpha optimizer is never built: ``log_alpha`` is in no optimizer."""

import sys

import torch
from torch import nn
from torch.func import functional_call


class SACLoss(nn.Module):
    def __init__(self, actor: nn.Module, qvalue: nn.Module, num_qvalue_nets: int = 2, alpha_init: float = 1.0) -> None:
        super().__init__()
        self.actor_network_params = nn.ParameterDict({k.replace(".", "_"): p for k, p in actor.named_parameters()})
        expanded = {}
        for key, p in qvalue.named_parameters():
            copy = p.detach().expand(num_qvalue_nets, *p.shape).clone()
            expanded[key.replace(".", "_")] = nn.Parameter(copy.uniform_(p.min().item(), p.max().item()))
        self.qvalue_network_params = nn.ParameterDict(expanded)
        self.target_qvalue_network_params = nn.ParameterDict(
            {k: nn.Parameter(p.detach().clone(), requires_grad=False) for k, p in expanded.items()})
        self.__dict__["actor_network"] = actor  # kept, not registered (its parameters are above)
        self.__dict__["qvalue_network"] = qvalue
        self.names = [key for key, _ in qvalue.named_parameters()]
        self.log_alpha = nn.Parameter(torch.tensor(float(alpha_init)).log())
        self.target_entropy = -1.0

    def _q(self, params: nn.ParameterDict, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.stack([functional_call(self.qvalue_network, {n: params[n.replace(".", "_")][i] for n in self.names},
                                            (torch.cat([obs, action], -1),)) for i in range(2)])

    def forward(self, obs, action, reward, next_obs):
        mean, log_std = self.actor_network(obs).chunk(2, -1)
        dist = torch.distributions.Normal(mean, log_std.clamp(-5, 2).exp())
        sample = dist.rsample()
        log_prob = dist.log_prob(sample).sum(-1, keepdim=True)
        alpha = self.log_alpha.exp()
        loss_actor = (alpha.detach() * log_prob - self._q(self.qvalue_network_params, obs, sample).min(0).values).mean()
        with torch.no_grad():
            next_mean, _ = self.actor_network(next_obs).chunk(2, -1)
            target = reward + 0.99 * self._q(self.target_qvalue_network_params, next_obs, next_mean).min(0).values
        loss_qvalue = (self._q(self.qvalue_network_params, obs, action) - target).pow(2).mean()
        loss_alpha = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        return loss_actor, loss_qvalue, loss_alpha


torch.manual_seed(0)
obs_dim, act_dim = 4, 2
actor = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, 2 * act_dim))
qvalue = nn.Sequential(nn.Linear(obs_dim + act_dim, 32), nn.Tanh(), nn.Linear(32, 1))
optimizers = {"actor": torch.optim.Adam(actor.parameters(), lr=3e-4)}
loss_module = SACLoss(actor, qvalue)
optimizers["qvalue"] = torch.optim.Adam(loss_module.qvalue_network_params.parameters(), lr=3e-4)
if "--forget-alpha" not in sys.argv:
    optimizers["alpha"] = torch.optim.Adam([loss_module.log_alpha], lr=3e-4)

for step in range(6):
    obs, action = torch.randn(16, obs_dim), torch.rand(16, act_dim) * 2 - 1
    loss_actor, loss_qvalue, loss_alpha = loss_module(obs, action, torch.randn(16, 1), torch.randn(16, obs_dim))
    for opt in optimizers.values():
        opt.zero_grad()
    (loss_actor + loss_qvalue + loss_alpha).backward()
    for opt in optimizers.values():
        opt.step()
    with torch.no_grad():  # SoftUpdate
        for key, p in loss_module.qvalue_network_params.items():
            loss_module.target_qvalue_network_params[key].lerp_(p, 0.005)
print("done")
