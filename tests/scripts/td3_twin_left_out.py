"""TD3 at module level: the second critic was left out of the critic optimizer (target networks
soft-updated, the actor stepped every other step)."""

import copy
import torch
from torch import nn
torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1))
critic1 = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
critic2 = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
actor_t, c1_t, c2_t = copy.deepcopy(actor), copy.deepcopy(critic1), copy.deepcopy(critic2)
actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
critic_opt = torch.optim.Adam(critic1.parameters(), lr=1e-3)  # critic2 left out
for step in range(40):
    s, a, r, s2 = torch.randn(8, 3), torch.randn(8, 1), torch.randn(8, 1), torch.randn(8, 3)
    with torch.no_grad():
        a2 = actor_t(s2)
        tq = r + 0.99 * torch.min(c1_t(torch.cat([s2, a2], 1)), c2_t(torch.cat([s2, a2], 1)))
    q1 = critic1(torch.cat([s, a], 1)); q2 = critic2(torch.cat([s, a], 1))
    critic_loss = (q1 - tq).pow(2).mean() + (q2 - tq).pow(2).mean()
    critic_opt.zero_grad(); critic_loss.backward(); critic_opt.step()
    if step % 2 == 0:
        actor_loss = -critic1(torch.cat([s, actor(s)], 1)).mean()
        actor_opt.zero_grad(); actor_loss.backward(); actor_opt.step()
        with torch.no_grad():
            for n, t in ((actor, actor_t), (critic1, c1_t), (critic2, c2_t)):
                for p, tp in zip(n.parameters(), t.parameters()):
                    tp.mul_(0.995).add_(0.005 * p)
print("done")
