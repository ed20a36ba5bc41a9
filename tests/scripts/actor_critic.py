"""A module-level actor-critic loop with target networks (soft updates, no optimizer), the
optimizers kept in a dict: clean."""

import copy

import torch
from torch import nn

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1), nn.Tanh())
critic = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
actor_target, critic_target = copy.deepcopy(actor), copy.deepcopy(critic)
optimizers = {"actor": torch.optim.Adam(actor.parameters(), lr=1e-3),
              "critic": torch.optim.Adam(critic.parameters(), lr=1e-3)}
for step in range(30):
    state, reward, next_state = torch.randn(8, 3), torch.randn(8, 1), torch.randn(8, 3)
    action = torch.randn(8, 1)
    with torch.no_grad():
        target_q = reward + 0.99 * critic_target(torch.cat([next_state, actor_target(next_state)], 1))
    q = critic(torch.cat([state, action], 1))
    critic_loss = (q - target_q).pow(2).mean()
    optimizers["critic"].zero_grad()
    critic_loss.backward()
    optimizers["critic"].step()
    actor_loss = -critic(torch.cat([state, actor(state)], 1)).mean()
    optimizers["actor"].zero_grad()
    actor_loss.backward()
    optimizers["actor"].step()
    with torch.no_grad():
        for net, target in ((actor, actor_target), (critic, critic_target)):
            for p, tp in zip(net.parameters(), target.parameters()):
                tp.mul_(0.995).add_(0.005 * p)
print("actor-critic done")
