"""Forward-forward as in pytorch/examples mnist_forward_forward: each layer has its own optimizer and
is called through ``.forward()`` (never ``layer(x)``), and the layers' forward forgets the bias."""
import torch
import torch.nn as nn
from torch.optim import Adam


class Layer(nn.Linear):
    def __init__(self, in_features, out_features):
        super().__init__(in_features, out_features)
        self.relu = torch.nn.ReLU()
        self.opt = Adam(self.parameters(), lr=0.03)
        self.threshold = 2.0
        self.num_epochs = 3

    def forward(self, x):
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T))

    def train(self, x_pos, x_neg):
        for _ in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(torch.nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.layers = [Layer(dims[d], dims[d + 1]) for d in range(len(dims) - 1)]

    def train(self, x_pos, x_neg):
        h_pos, h_neg = x_pos, x_neg
        for layer in self.layers:
            h_pos, h_neg = layer.train(h_pos, h_neg)


if __name__ == "__main__":
    torch.manual_seed(0)
    net = Net([8, 6, 4])
    net.train(torch.randn(5, 8), torch.randn(5, 8))
    print("done")
