"""diffusers: a ``UNet2DModel`` built from a small config, trained with a ``DDPMScheduler`` on the
noise-prediction loss, as diffusers' ``train_unconditional.py`` trains it (AdamW, a cosine
learning-rate schedule from ``diffusers.optimization``, ``clip_grad_norm_``, an ``EMAModel``), and
saved with ``save_pretrained``, loaded with ``UNet2DModel.from_pretrained``. Random 16x16 images.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from _transparency import arguments, attach_monitor, close_monitor, print_loss
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.optimization import get_cosine_schedule_with_warmup
from diffusers.training_utils import EMAModel

STEPS = 4


def make_model() -> UNet2DModel:
    return UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(16, 32), norm_num_groups=8,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))


def load(out: Path) -> dict:
    return UNet2DModel.from_pretrained(str(out / "unet")).state_dict()


if __name__ == "__main__":
    out, args = arguments(load)
    torch.manual_seed(0)
    model = make_model()
    noise_scheduler = DDPMScheduler(num_train_timesteps=100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.95, 0.999), weight_decay=1e-6, eps=1e-8)
    lr_scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=STEPS)
    ema_model = EMAModel(model.parameters(), decay=0.999, model_cls=UNet2DModel, model_config=model.config)
    monitor = attach_monitor(model, optimizer, out)
    clean_images = torch.randn(4, 3, 16, 16)
    model.train()
    for step in range(1, STEPS + 1):
        noise = torch.randn(clean_images.shape)
        timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (clean_images.shape[0],)).long()
        noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
        model_output = model(noisy_images, timesteps).sample
        loss = F.mse_loss(model_output.float(), noise.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        ema_model.step(model.parameters())
        print_loss(step, loss)
    close_monitor(monitor)
    model.save_pretrained(str(out / "unet"))
