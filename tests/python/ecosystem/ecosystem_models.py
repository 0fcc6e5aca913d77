"""Models nobody here wrote, as users bring them: torchvision's ResNet-18 and
Hugging Face's GPT-2, Llama and BERT, in small configurations with random
weights (nothing is downloaded), in float64. Each comes with a batch, its
loss, where to cut it (inside its stack of blocks) and the keywords that
choose the output its loss reads."""
import dataclasses
import importlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

BATCH = 8
VOCAB = 96
SEQUENCE = 12


@dataclasses.dataclass
class Case:
    model: nn.Module
    inputs: Tuple[torch.Tensor, ...]
    target: torch.Tensor
    loss_fn: Callable[[Any, Any], torch.Tensor]
    split_points: List[str]
    four_stages: List[str]  # split points for 2 workers of 2 chunks (interleaved, or a V)
    keywords: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def forward(self, model: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
        """The output the loss reads, from the eager model."""
        out = model(*inputs, **self.keywords.get("model_kwargs", {}))
        return out.logits if self.keywords.get("output") == "logits" else out

    def eager_step(self, model: nn.Module, microbatches: int) -> float:
        """The eager model's loss and gradients, micro-batch by micro-batch
        as the pipeline runs them (batch norm's statistics), as a mean."""
        total = 0.0
        for i in range(microbatches):
            inputs = [t.chunk(microbatches)[i] for t in self.inputs]
            loss = self.loss_fn(self.forward(model, *inputs), self.target.chunk(microbatches)[i]) / microbatches
            loss.backward()
            total += loss.item()
        return total


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _tokens(seed: int) -> Tuple[Tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(VOCAB, (BATCH, SEQUENCE), generator=g),), torch.randint(VOCAB, (BATCH, SEQUENCE), generator=g)


def resnet18(seed: int = 0) -> Case:
    import torchvision
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=10).double()
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(BATCH, 3, 32, 32, generator=g, dtype=torch.float64), torch.randint(10, (BATCH,), generator=g)
    return Case(model, (x,), y, nn.functional.cross_entropy, ["layer2", "layer3.1"],
                ["layer2", "layer3", "layer4"])


def gpt2(seed: int = 0) -> Case:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
                        eos_token_id=0, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)
    inputs, target = _tokens(seed)
    return Case(GPT2LMHeadModel(config).double(), inputs, target, token_loss, ["transformer.h.2"],
                ["transformer.h.1", "transformer.h.2", "transformer.h.3"],
                {"output": "logits", "model_kwargs": {"use_cache": False}})


def llama(seed: int = 0) -> Case:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                         eos_token_id=0, pad_token_id=0)
    inputs, target = _tokens(seed)
    return Case(LlamaForCausalLM(config).double(), inputs, target, token_loss, ["model.layers.2"],
                ["model.layers.1", "model.layers.2", "model.layers.3"],
                {"output": "logits", "model_kwargs": {"use_cache": False}})


def bert(seed: int = 0) -> Case:
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(seed)
    config = BertConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                        vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    inputs, target = _tokens(seed)
    return Case(BertForMaskedLM(config).double(), inputs, target, token_loss, ["bert.encoder.layer.2"],
                ["bert.encoder.layer.1", "bert.encoder.layer.2", "bert.encoder.layer.3"],
                {"output": "logits"})


CASES = {"resnet18": resnet18, "gpt2": gpt2, "llama": llama, "bert": bert}
PACKAGES = {"resnet18": "torchvision", "gpt2": "transformers", "llama": "transformers", "bert": "transformers"}


def missing(name: str) -> Optional[str]:
    """Why the case cannot run here, or None. The set-up installs both
    packages; only torchvision may be absent, where no release of it loads
    beside this torch (the CPU wheel of torch 2.13 has none on the index)."""
    try:
        importlib.import_module(PACKAGES[name])
    except Exception as error:  # noqa: BLE001  (an ImportError, or torchvision's RuntimeError)
        if PACKAGES[name] != "torchvision":
            raise
        return f"torchvision does not load beside torch {torch.__version__}: {error}"
    return None
