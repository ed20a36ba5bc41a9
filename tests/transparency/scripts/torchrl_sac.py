"""torchrl: SAC with one optimizer per parameter group (actor, critic, temperature) merged by
``group_optimizers``, as torchrl's ``sota-implementations/sac`` trains it: one backward of the three
losses, one step. A ``ProbabilisticActor`` with a ``TanhNormal`` head and a
``ValueOperator`` critic built from lazy ``MLP``s (initialized on a fake tensordict), ``SACLoss`` with
two Q-value nets and a delayed target, ``SoftUpdate``, and a replay buffer filled with synthetic
transitions (no environment). The checkpoint is the loss module's ``state_dict``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from tensordict import TensorDict
from tensordict.nn import InteractionType, NormalParamExtractor, TensorDictModule
from torch import nn, optim
from torchrl.data import Bounded, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SACLoss, SoftUpdate, group_optimizers

OBS, ACT, N = 6, 2, 256
STEPS = 30


def make_model() -> nn.ModuleList:
    action_spec = Bounded(low=-1.0, high=1.0, shape=(ACT,))
    actor_net = nn.Sequential(MLP(num_cells=[32, 32], out_features=2 * ACT, activation_class=nn.ReLU),
                              NormalParamExtractor(scale_mapping="biased_softplus_1.0", scale_lb=1e-4))
    actor = ProbabilisticActor(
        spec=action_spec, in_keys=["loc", "scale"],
        module=TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high, "tanh_loc": False},
        default_interaction_type=InteractionType.RANDOM, return_log_prob=False)
    qvalue = ValueOperator(in_keys=["action", "observation"],
                           module=MLP(num_cells=[32, 32], out_features=1, activation_class=nn.ReLU))
    model = nn.ModuleList([actor, qvalue])
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):  # init the lazy layers
        fake = TensorDict({"observation": torch.zeros(1, OBS), "action": torch.zeros(1, ACT)}, batch_size=[1])
        for net in model:
            net(fake)
    return model


def make_loss(model: nn.ModuleList) -> SACLoss:
    loss_module = SACLoss(actor_network=model[0], qvalue_network=model[1], num_qvalue_nets=2,
                          loss_function="l2", delay_actor=False, delay_qvalue=True, alpha_init=1.0)
    loss_module.make_value_estimator(gamma=0.99)
    return loss_module


def load(out: Path) -> dict:
    loss_module = make_loss(make_model())
    loss_module.load_state_dict(torch.load(out / "sac.pt", weights_only=True))
    return loss_module.state_dict()



if __name__ == "__main__":
    out, args = arguments(load)
    torch.manual_seed(0)
    model = make_model()
    loss_module = make_loss(model)
    target_net_updater = SoftUpdate(loss_module, eps=0.995)
    critic_params = list(loss_module.qvalue_network_params.flatten_keys().values())
    actor_params = list(loss_module.actor_network_params.flatten_keys().values())
    optimizer_actor = optim.Adam(actor_params, lr=3e-4, weight_decay=0.0, eps=1e-8)
    optimizer_critic = optim.Adam(critic_params, lr=3e-4, weight_decay=0.0, eps=1e-8)
    optimizer_alpha = optim.Adam([loss_module.log_alpha], lr=3.0e-4)
    optimizer = group_optimizers(optimizer_actor, optimizer_critic, optimizer_alpha)
    del optimizer_actor, optimizer_critic, optimizer_alpha
    monitor = attach_monitor(loss_module, optimizer, out)

    replay_buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(N), batch_size=32)
    replay_buffer.extend(TensorDict({
        "observation": torch.randn(N, OBS), "action": torch.rand(N, ACT) * 2 - 1,
        "next": {"observation": torch.randn(N, OBS), "reward": torch.randn(N, 1),
                 "done": torch.zeros(N, 1, dtype=torch.bool), "terminated": torch.zeros(N, 1, dtype=torch.bool)},
    }, batch_size=[N]))
    for step in range(1, STEPS + 1):
        sampled_tensordict = replay_buffer.sample().clone()
        loss_td = loss_module(sampled_tensordict)
        actor_loss, q_loss, alpha_loss = loss_td["loss_actor"], loss_td["loss_qvalue"], loss_td["loss_alpha"]
        (actor_loss + q_loss + alpha_loss).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        target_net_updater.step()
        print_loss(step, actor_loss + q_loss + alpha_loss)
    close_monitor(monitor)
    torch.save(loss_module.state_dict(), out / "sac.pt")

