"""A Gaussian policy trained with REINFORCE whose standard deviation ``std = log_std.exp()`` is computed once,
before the loop, from the learned ``log_std`` (the shape of the PyTorch forum thread "Trying to backward through
the graph a second time" for a policy's ``log_std``; also the sigma of many VAE/policy examples): the first
``loss.backward()`` frees the graph of ``exp``, and the second goes through it again."""

import torch
from torch import nn

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
log_std = nn.Parameter(torch.zeros(2))
optimizer = torch.optim.Adam([*policy.parameters(), log_std], lr=1e-3)
std = log_std.exp()
for episode in range(4):
    states = torch.randn(16, 4)
    mean = policy(states)
    dist = torch.distributions.Normal(mean, std)
    actions = dist.sample()
    rewards = -(actions - 1.0).pow(2).sum(-1)
    loss = -(dist.log_prob(actions).sum(-1) * (rewards - rewards.mean())).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
