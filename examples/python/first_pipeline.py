# The README's Python example, whole: an nn.Module cut into 3 stages under 1F1B.
import torch, torch.nn.functional as F
from torch import nn
import conveyor

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
pipe = conveyor.Pipeline(model, split_points=["2", "4"], microbatches=4, schedule="1f1b",
                         loss_fn=lambda out, target: F.cross_entropy(out, target))
opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
x = torch.randn(256, 16)
y = x[:, :4].argmax(1)                          # the class is the largest of the first 4 features
for step in range(60):
    loss = pipe.train_step(x, y).loss           # the whole batch's loss and gradients
    opt.step(); opt.zero_grad()
print(f"loss {loss:.3f} after 60 steps")
assert loss < 0.5, "the loss did not fall"
