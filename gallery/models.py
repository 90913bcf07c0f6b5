"""The gallery: models nobody here wrote, built the way their users build them.

Tiny configurations with random weights (seeded), so that nothing is
downloaded; the code that runs is the libraries' own. Each factory returns the
model in eval mode; the capture calls it the way its users call it (see the
*.calls.json beside this file), and the gallery's tests call the served model
the same way and compare with these models run eagerly.
"""

import torch


def make_bert() -> torch.nn.Module:
    """A Hugging Face encoder, called as model(input_ids=..., attention_mask=...)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    return BertModel(config).eval()


def make_gpt2(use_cache: bool = False) -> torch.nn.Module:
    """A Hugging Face decoder with its language-model head. Without its
    cache, for scoring whole sequences; with it (make_gpt2_decoder), for
    generating: each call returns the keys and values of every position so
    far, and the next call passes them back with only the new token."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=1000,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        use_cache=use_cache,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config).eval()


def make_gpt2_decoder() -> torch.nn.Module:
    """make_gpt2()'s weights with its cache on, as model.generate() calls it."""
    return make_gpt2(use_cache=True)


def make_llama_decoder() -> torch.nn.Module:
    """A Llama decoder (rotary positions, grouped-query attention: 2 key and
    value heads for 4 query heads) with its cache, as model.generate() calls it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def make_t5_decoder() -> torch.nn.Module:
    """A Hugging Face encoder-decoder (T5: relative position buckets, the
    encoder's keys and values cached for cross-attention) with its cache, as
    model.generate() calls it: the encoder once, then one new decoder token
    per call with the encoder's output and the cache of both attentions."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=1000,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        use_cache=True,
    )
    return T5ForConditionalGeneration(config).eval()


def empty_t5_cache():
    """What model.generate() passes an encoder-decoder's first call: an
    empty cache for each attention (T5 would make it inside its forward,
    where Dynamo cannot follow the copy of its config that takes)."""
    from transformers import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(), DynamicCache())


def make_roberta() -> torch.nn.Module:
    """A Hugging Face RoBERTa sentence classifier. Its position ids count
    the tokens that are not padding, from pad_token_id + 1
    (create_position_ids_from_input_ids), so its table of 130 positions
    takes at most 128 tokens."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=130,
        pad_token_id=1,
        num_labels=3,
    )
    return RobertaForSequenceClassification(config).eval()


def make_opt() -> torch.nn.Module:
    """A Hugging Face OPT language model. Its positions count the attention
    mask's ones (a cumsum), plus an offset of 2, into a table of 130: the
    mask's values decide which rows are read."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        ffn_dim=128,
        num_attention_heads=4,
        max_position_embeddings=128,
        word_embed_proj_dim=64,
        use_cache=False,
        pad_token_id=1,
    )
    return OPTForCausalLM(config).eval()


def make_resnet18() -> torch.nn.Module:
    """torchvision's resnet18 as torchvision.models.resnet18() builds it."""
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


@torch._dynamo.disable
def _recenter(hidden: torch.Tensor) -> torch.Tensor:
    """Post-processing kept out of Dynamo's graph, as instrumentation and
    custom kernels often are: a graph break wherever it is called."""
    return hidden - hidden.mean(dim=-1, keepdim=True)


class BertWithRecentering(torch.nn.Module):
    """A Hugging Face encoder behind a wrapper written the way model code is:
    **kwargs passed through, and optional post-processing steps in a loop
    around a helper Dynamo cannot trace (a graph break it cannot resume from,
    so the entry is flagged eager_fallback, and TorchScript can script
    neither the wrapper nor BertModel). Its encoder layers are captured as
    frames of their own, so its eager program (Python) still runs them
    compiled."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor = None,
                recenter_steps: int = 0, **kwargs) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        for _ in range(recenter_steps):
            hidden = _recenter(hidden)
        return hidden


def make_bert_recentering() -> torch.nn.Module:
    """make_bert()'s encoder, called as model(input_ids=..., attention_mask=...,
    recenter_steps=n); frames bert.encoder.layer.0 and .1."""
    return BertWithRecentering(make_bert()).eval()


class DecoderWithRecentering(torch.nn.Module):
    """A Hugging Face decoder behind a generation wrapper of the same kind:
    its logits post-processed in a loop around the helper Dynamo cannot
    trace, so the entry is flagged eager_fallback once a call asks for a
    step, and its eager program is Python (TorchScript can script neither
    the wrapper nor a DynamicCache). The language model is a frame of its
    own: inside the program it runs its compiled prefill and decode variants
    with the cache the wrapper passes through. Recentering shifts each row of
    logits by one number, so greedy tokens are the language model's own."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor = None,
                position_ids: torch.Tensor = None, past_key_values=None, recenter_steps: int = 1):
        from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: PLC0415

        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      past_key_values=past_key_values, use_cache=True)
        logits = out.logits
        for _ in range(recenter_steps):
            logits = _recenter(logits)
        return CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values)


def make_gpt2_decoder_recentering() -> torch.nn.Module:
    """make_gpt2_decoder() behind DecoderWithRecentering; frame lm."""
    return DecoderWithRecentering(make_gpt2_decoder()).eval()
