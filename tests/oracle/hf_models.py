"""Hugging Face models written as plain PyTorch modules, op for op as
transformers' modeling files (4.4x, eager attention) write them, for the
oracle (torch_oracle.py). No transformers package is needed: each class
names the transformers class it follows; the comments name what decides
memory. Dropout is CUDA's fused kernel (torch_oracle.Dropout)."""

import math

import torch
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F

from cuda_kernels import Dropout, cuda_dropout


# ---------------------------------------------------------------- BERT (modeling_bert.py)


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], d, padding_idx=c.get("pad_token_id", 0))
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], d)
        self.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), d)
        self.LayerNorm = nn.LayerNorm(d, eps=c.get("layer_norm_eps", 1e-12))
        self.dropout = Dropout(c.get("hidden_dropout_prob", 0.1))
        self.register_buffer("position_ids", torch.arange(c["max_position_embeddings"]).expand((1, -1)),
                             persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(self.position_ids.size(), dtype=torch.long),
                             persistent=False)

    def forward(self, input_ids):
        batch, seq = input_ids.shape
        position_ids = self.position_ids[:, 0:seq]
        token_type_ids = self.token_type_ids[:, :seq].expand(batch, seq)
        inputs_embeds = self.word_embeddings(input_ids)
        token_type_embeddings = self.token_type_embeddings(token_type_ids)
        embeddings = inputs_embeds + token_type_embeddings
        position_embeddings = self.position_embeddings(position_ids)
        embeddings += position_embeddings
        embeddings = self.LayerNorm(embeddings)
        embeddings = self.dropout(embeddings)
        return embeddings


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.num_attention_heads = c["num_attention_heads"]
        self.attention_head_size = d // self.num_attention_heads
        self.all_head_size = d
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.dropout = Dropout(c.get("attention_probs_dropout_prob", 0.1))

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        mixed_query_layer = self.query(hidden_states)
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        query_layer = self.transpose_for_scores(mixed_query_layer)
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_scores = attention_scores + attention_mask
        attention_probs = F.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        return context_layer.view(new_context_layer_shape)


class BertSelfOutput(nn.Module):  # also BertOutput, with the intermediate size in
    def __init__(self, c, inner):
        super().__init__()
        self.dense = nn.Linear(inner, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-12))
        self.dropout = Dropout(c.get("hidden_dropout_prob", 0.1))

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return self.LayerNorm(hidden_states + input_tensor)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c, c["hidden_size"])

    def forward(self, hidden_states, attention_mask):
        return self.output(self.self(hidden_states, attention_mask), hidden_states)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])

    def forward(self, hidden_states):
        return F.gelu(self.dense(hidden_states))


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertSelfOutput(c, c["intermediate_size"])

    def forward(self, hidden_states, attention_mask):
        attention_output = self.attention(hidden_states, attention_mask)
        intermediate_output = self.intermediate(attention_output)
        return self.output(intermediate_output, attention_output)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c["num_hidden_layers"])])

        self.gradient_checkpointing = c.get("gradient_checkpointing", False)  # the oracle's switch

    def forward(self, hidden_states, attention_mask):
        for layer in self.layer:
            if self.gradient_checkpointing and self.training:  # transformers 4.2x-4.4x: reentrant
                hidden_states = torch.utils.checkpoint.checkpoint(layer, hidden_states, attention_mask)
            else:
                hidden_states = layer(hidden_states, attention_mask)
        return hidden_states


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])

    def forward(self, hidden_states):
        return torch.tanh(self.dense(hidden_states[:, 0]))


class BertModel(nn.Module):
    def __init__(self, c, add_pooling_layer=True):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.pooler = BertPooler(c) if add_pooling_layer else None

    def forward(self, input_ids):
        batch, seq = input_ids.shape
        # No attention_mask given: all ones, made into an additive mask
        # (get_extended_attention_mask), alive until forward returns.
        attention_mask = torch.ones((batch, seq), device=input_ids.device)
        extended = attention_mask[:, None, None, :].to(dtype=torch.float32)
        extended = (1.0 - extended) * torch.finfo(torch.float32).min
        embedding_output = self.embeddings(input_ids)
        sequence_output = self.encoder(embedding_output, extended)
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None
        return sequence_output, pooled_output


class BertLMPredictionHead(nn.Module):
    def __init__(self, c, word_embeddings):
        super().__init__()
        d = c["hidden_size"]
        self.transform_dense = nn.Linear(d, d)
        self.transform_LayerNorm = nn.LayerNorm(d, eps=c.get("layer_norm_eps", 1e-12))
        self.decoder = nn.Linear(d, c["vocab_size"], bias=False)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(c["vocab_size"]))
        self.decoder.bias = self.bias

    def forward(self, hidden_states):
        hidden_states = self.transform_LayerNorm(F.gelu(self.transform_dense(hidden_states)))
        return self.decoder(hidden_states)


class BertForPreTraining(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.predictions = BertLMPredictionHead(c, self.bert.embeddings.word_embeddings)
        self.seq_relationship = nn.Linear(c["hidden_size"], 2)

    def forward(self, input_ids):
        sequence_output, pooled_output = self.bert(input_ids)
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)

    @staticmethod
    def loss(outputs, targets):
        prediction_scores, seq_relationship_score = outputs
        labels, next_sentence_label = targets
        vocab = prediction_scores.shape[-1]
        masked_lm_loss = F.cross_entropy(prediction_scores.view(-1, vocab), labels.view(-1))
        next_sentence_loss = F.cross_entropy(seq_relationship_score.view(-1, 2), next_sentence_label.view(-1))
        return masked_lm_loss + next_sentence_loss

    @staticmethod
    def batch(c, batch, seq):
        ids = torch.randint(0, c["vocab_size"], (batch, seq))
        return ((ids,), (torch.randint(0, c["vocab_size"], (batch, seq)), torch.randint(0, 2, (batch,))))


class BertOnlyHead(nn.Module):
    """The single-head models: a BertModel (or RobertaModel) and the head."""

    pooler = False
    is_roberta = False

    def __init__(self, c):
        super().__init__()
        model = RobertaModel if self.is_roberta else BertModel
        setattr(self, self.prefix(), model(c, add_pooling_layer=self.pooler))
        self.config = c

    def prefix(self):
        return "roberta" if self.is_roberta else "bert"

    def trunk(self):
        return getattr(self, self.prefix())

    @staticmethod
    def classification_loss(logits, labels, num_labels):
        if num_labels == 1:  # regression: MSELoss(logits.squeeze(), labels.squeeze())
            return F.mse_loss(logits.squeeze(), labels.squeeze())
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1))


def num_labels(c):
    return c.get("num_labels", 2)


class BertForMaskedLM(BertOnlyHead):
    def __init__(self, c):
        super().__init__(c)
        self.predictions = BertLMPredictionHead(c, self.trunk().embeddings.word_embeddings)

    def forward(self, input_ids):
        sequence_output, _ = self.trunk()(input_ids)
        return self.predictions(sequence_output)

    @staticmethod
    def loss(prediction_scores, labels):
        return F.cross_entropy(prediction_scores.view(-1, prediction_scores.shape[-1]), labels.view(-1))

    @staticmethod
    def batch(c, batch, seq):
        return ((torch.randint(0, c["vocab_size"], (batch, seq)),), torch.randint(0, c["vocab_size"], (batch, seq)))


class BertForSequenceClassification(BertOnlyHead):
    pooler = True

    def __init__(self, c):
        super().__init__(c)
        p = c.get("classifier_dropout") or c.get("hidden_dropout_prob", 0.1)
        self.dropout = Dropout(p)
        self.classifier = nn.Linear(c["hidden_size"], num_labels(c))

    def forward(self, input_ids):
        _, pooled_output = self.trunk()(input_ids)
        return self.classifier(self.dropout(pooled_output))

    def loss(self, logits, labels):
        return self.classification_loss(logits, labels, num_labels(self.config))

    @staticmethod
    def batch(c, batch, seq):
        ids = torch.randint(0, c["vocab_size"], (batch, seq))
        if num_labels(c) == 1:
            return ((ids,), torch.randn(batch, 1))
        return ((ids,), torch.randint(0, num_labels(c), (batch,)))


class BertForTokenClassification(BertOnlyHead):
    def __init__(self, c):
        super().__init__(c)
        p = c.get("classifier_dropout") or c.get("hidden_dropout_prob", 0.1)
        self.dropout = Dropout(p)
        self.classifier = nn.Linear(c["hidden_size"], num_labels(c))

    def forward(self, input_ids):
        sequence_output, _ = self.trunk()(input_ids)
        return self.classifier(self.dropout(sequence_output))

    def loss(self, logits, labels):
        return self.classification_loss(logits, labels, num_labels(self.config))

    @staticmethod
    def batch(c, batch, seq):
        return ((torch.randint(0, c["vocab_size"], (batch, seq)),), torch.randint(0, num_labels(c), (batch, seq)))


# ---------------------------------------------------------------- RoBERTa (modeling_roberta.py)


class RobertaEmbeddings(BertEmbeddings):
    def __init__(self, c):
        super().__init__(c)
        self.padding_idx = c.get("pad_token_id", 1)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"],
                                                padding_idx=self.padding_idx)

    def forward(self, input_ids):
        batch, seq = input_ids.shape
        # create_position_ids_from_input_ids
        mask = input_ids.ne(self.padding_idx).int()
        incremental_indices = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask
        position_ids = incremental_indices.long() + self.padding_idx
        token_type_ids = self.token_type_ids[:, :seq].expand(batch, seq)
        inputs_embeds = self.word_embeddings(input_ids)
        token_type_embeddings = self.token_type_embeddings(token_type_ids)
        embeddings = inputs_embeds + token_type_embeddings
        position_embeddings = self.position_embeddings(position_ids)
        embeddings += position_embeddings
        embeddings = self.LayerNorm(embeddings)
        embeddings = self.dropout(embeddings)
        return embeddings


class RobertaModel(BertModel):
    def __init__(self, c, add_pooling_layer=True):
        super().__init__(c, add_pooling_layer)
        self.embeddings = RobertaEmbeddings(c)


class RobertaLMHead(nn.Module):
    def __init__(self, c, word_embeddings):
        super().__init__()
        d = c["hidden_size"]
        self.dense = nn.Linear(d, d)
        self.layer_norm = nn.LayerNorm(d, eps=c.get("layer_norm_eps", 1e-12))
        self.decoder = nn.Linear(d, c["vocab_size"])
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = self.decoder.bias

    def forward(self, features):
        return self.decoder(self.layer_norm(F.gelu(self.dense(features))))


class RobertaForMaskedLM(BertForMaskedLM):
    is_roberta = True

    def __init__(self, c):
        BertOnlyHead.__init__(self, c)
        self.lm_head = RobertaLMHead(c, self.trunk().embeddings.word_embeddings)

    def forward(self, input_ids):
        sequence_output, _ = self.trunk()(input_ids)
        return self.lm_head(sequence_output)


class RobertaClassificationHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        p = c.get("classifier_dropout") or c.get("hidden_dropout_prob", 0.1)
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.dropout = Dropout(p)
        self.out_proj = nn.Linear(c["hidden_size"], num_labels(c))

    def forward(self, features):
        x = features[:, 0, :]
        x = self.dropout(x)
        x = self.dense(x)
        x = torch.tanh(x)
        x = self.dropout(x)
        return self.out_proj(x)


class RobertaForSequenceClassification(BertForSequenceClassification):
    is_roberta = True
    pooler = False

    def __init__(self, c):
        BertOnlyHead.__init__(self, c)
        self.classifier = RobertaClassificationHead(c)

    def forward(self, input_ids):
        sequence_output, _ = self.trunk()(input_ids)
        return self.classifier(sequence_output)


class RobertaForTokenClassification(BertForTokenClassification):
    is_roberta = True


class BertForQuestionAnswering(BertOnlyHead):
    """The split into start and end logits is in the loss here (transformers
    does it at the end of forward), as memscope's `span` loss does."""

    def __init__(self, c):
        super().__init__(c)
        self.qa_outputs = nn.Linear(c["hidden_size"], num_labels(c))

    def forward(self, input_ids):
        sequence_output, _ = self.trunk()(input_ids)
        return self.qa_outputs(sequence_output)

    @staticmethod
    def loss(logits, positions):
        start_positions, end_positions = positions
        start_logits, end_logits = logits.split(1, dim=-1)
        start_logits = start_logits.squeeze(-1).contiguous()
        end_logits = end_logits.squeeze(-1).contiguous()
        ignored_index = start_logits.size(1)
        start_positions = start_positions.clamp(0, ignored_index)
        end_positions = end_positions.clamp(0, ignored_index)
        start_loss = F.cross_entropy(start_logits, start_positions, ignore_index=ignored_index)
        end_loss = F.cross_entropy(end_logits, end_positions, ignore_index=ignored_index)
        return (start_loss + end_loss) / 2

    @staticmethod
    def batch(c, batch, seq):
        ids = torch.randint(0, c["vocab_size"], (batch, seq))
        return ((ids,), (torch.randint(0, seq, (batch,)), torch.randint(0, seq, (batch,))))


class RobertaForQuestionAnswering(BertForQuestionAnswering):
    is_roberta = True


HF_MODELS = {
    ("bert", "BertForQuestionAnswering"): BertForQuestionAnswering,
    ("roberta", "RobertaForQuestionAnswering"): RobertaForQuestionAnswering,
    ("bert", "BertForPreTraining"): BertForPreTraining,
    ("bert", "BertForMaskedLM"): BertForMaskedLM,
    ("bert", "BertForSequenceClassification"): BertForSequenceClassification,
    ("bert", "BertForTokenClassification"): BertForTokenClassification,
    ("roberta", "RobertaForMaskedLM"): RobertaForMaskedLM,
    ("roberta", "RobertaForSequenceClassification"): RobertaForSequenceClassification,
    ("roberta", "RobertaForTokenClassification"): RobertaForTokenClassification,
}


# ---------------------------------------------------------------- GPT-2 (modeling_gpt2.py, 4.46, eager)


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, positions = c["n_embd"], c.get("n_positions", 1024)
        self.register_buffer("bias", torch.tril(torch.ones((positions, positions), dtype=torch.bool)).view(
            1, 1, positions, positions), persistent=False)
        self.num_heads, self.head_dim, self.split_size = c["n_head"], d // c["n_head"], d
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)
        self.attn_dropout = Dropout(c.get("attn_pdrop", 0.1))
        self.resid_dropout = Dropout(c.get("resid_pdrop", 0.1))

    def _attn(self, query, key, value):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype,
                                                 device=attn_weights.device)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length:key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        attn_weights = F.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(value.dtype)
        attn_weights = self.attn_dropout(attn_weights)
        attn_output = torch.matmul(attn_weights, value)
        return attn_output, attn_weights

    def _split_heads(self, tensor):
        new_shape = tensor.size()[:-1] + (self.num_heads, self.head_dim)
        return tensor.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, use_cache):
        query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
        query, key, value = self._split_heads(query), self._split_heads(key), self._split_heads(value)
        present = (key, value) if use_cache else None
        attn_output, attn_weights = self._attn(query, key, value)
        attn_output = attn_output.permute(0, 2, 1, 3).contiguous()
        attn_output = attn_output.view(attn_output.size()[:-2] + (self.num_heads * self.head_dim,))
        attn_output = self.c_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)
        return attn_output, present


class GPT2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["n_embd"]
        inner = c.get("n_inner") or 4 * d
        self.c_fc = Conv1D(inner, d)
        self.c_proj = Conv1D(d, inner)
        self.dropout = Dropout(c.get("resid_pdrop", 0.1))

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = gelu_new(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        return self.dropout(hidden_states)


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c.get("layer_norm_epsilon", 1e-5)
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=eps)
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=eps)
        self.mlp = GPT2MLP(c)

    def forward(self, hidden_states, use_cache):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output, present = self.attn(hidden_states, use_cache)
        hidden_states = attn_output + residual
        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = residual + feed_forward_hidden_states
        return hidden_states, present


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        d = c["n_embd"]
        self.wte = nn.Embedding(c["vocab_size"], d)
        self.wpe = nn.Embedding(c.get("n_positions", 1024), d)
        self.drop = Dropout(c.get("embd_pdrop", 0.1))
        self.h = nn.ModuleList([GPT2Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(d, eps=c.get("layer_norm_epsilon", 1e-5))

    def forward(self, input_ids):
        use_cache = self.config.get("use_cache", True)
        seq = input_ids.shape[-1]
        position_ids = torch.arange(0, seq, dtype=torch.long).unsqueeze(0)
        inputs_embeds = self.wte(input_ids)
        position_embeds = self.wpe(position_ids)
        hidden_states = inputs_embeds + position_embeds
        hidden_states = self.drop(hidden_states)
        presents = () if use_cache else None
        for block in self.h:
            hidden_states, present = block(hidden_states, use_cache)
            if use_cache:
                presents = presents + (present,)
        hidden_states = self.ln_f(hidden_states)
        return hidden_states, presents


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids):
        hidden_states, presents = self.transformer(input_ids)
        logits = self.lm_head(hidden_states)
        self.presents = presents  # returned in outputs.past_key_values, which the caller holds
        return logits

    def loss(self, logits, labels):
        # ForCausalLMLoss: logits.float(), labels padded with -100 and shifted.
        logits = logits.float()
        labels = F.pad(labels, (0, 1), value=-100)
        shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, logits.shape[-1])
        return F.cross_entropy(logits, shift_labels.view(-1), ignore_index=-100)

    @staticmethod
    def batch(c, batch, seq):
        ids = torch.randint(0, c["vocab_size"], (batch, seq))
        return ((ids,), ids)


HF_MODELS[("gpt2", "GPT2LMHeadModel")] = GPT2LMHeadModel


# ---------------------------------------------------------------- the heads of decoders (4.46: GPT2For*, LlamaFor*)
# The trunk (GPT2Model, LlamaModel) returns the hidden states and, with
# use_cache, past_key_values: *ForSequenceClassification returns them with
# its logits; *ForTokenClassification and *ForQuestionAnswering drop them
# when forward returns (their outputs have no past_key_values). The trunk's
# outputs are a local until forward returns, as in transformers.


def classifier_dropout(c):
    """*ForTokenClassification's: classifier_dropout, else hidden_dropout, else 0.1."""
    if c.get("classifier_dropout") is not None:
        return c["classifier_dropout"]
    if c.get("hidden_dropout") is not None:
        return c["hidden_dropout"]
    return 0.1


def last_token_logits(c, input_ids, logits):
    """*ForSequenceClassification's pooled_logits: each row's last token
    before the first padding token."""
    batch_size = input_ids.shape[0]
    pad = c.get("pad_token_id")
    if pad is None and batch_size != 1:
        raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined.")
    if pad is None:
        sequence_lengths = -1
    else:
        # if no pad token found, use modulo instead of reverse indexing for ONNX compatibility
        sequence_lengths = torch.eq(input_ids, pad).int().argmax(-1) - 1
        sequence_lengths = sequence_lengths % input_ids.shape[-1]
        sequence_lengths = sequence_lengths.to(logits.device)
    return logits[torch.arange(batch_size, device=logits.device), sequence_lengths]


class DecoderForSequenceClassification(nn.Module):
    """GPT2ForSequenceClassification (modeling_gpt2.py) and
    LlamaForSequenceClassification: score (no bias) on every token, then the
    last token's logits; the loss on them by problem_type."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.make_trunk(c)
        self.score = nn.Linear(self.hidden(c), num_labels(c), bias=False)

    def forward(self, input_ids):
        transformer_outputs = self.trunk()(input_ids)
        hidden_states = transformer_outputs[0]
        logits = self.score(hidden_states)
        self.presents = transformer_outputs[1]  # SequenceClassifierOutputWithPast.past_key_values
        return last_token_logits(self.config, input_ids, logits)

    def loss(self, pooled_logits, labels):
        return BertOnlyHead.classification_loss(pooled_logits, labels, num_labels(self.config))

    batch = staticmethod(BertForSequenceClassification.batch)


class DecoderForTokenClassification(nn.Module):
    """GPT2ForTokenClassification (classifier) and LlamaForTokenClassification
    (score, the loss on logits.float(): loss_utils.ForTokenClassification):
    dropout, then a linear with bias; cross-entropy."""

    classifier_name = "classifier"
    upcast = False

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.make_trunk(c)
        self.dropout = Dropout(classifier_dropout(c))
        setattr(self, self.classifier_name, nn.Linear(self.hidden(c), num_labels(c)))

    def forward(self, input_ids):
        outputs = self.trunk()(input_ids)
        sequence_output = outputs[0]
        sequence_output = self.dropout(sequence_output)
        return getattr(self, self.classifier_name)(sequence_output)

    def loss(self, logits, labels):
        logits = logits.view(-1, num_labels(self.config))
        labels = labels.view(-1)
        if self.upcast:
            logits = logits.float()
        return F.cross_entropy(logits, labels, ignore_index=-100)

    batch = staticmethod(BertForTokenClassification.batch)


class DecoderForQuestionAnswering(nn.Module):
    """GPT2ForQuestionAnswering and LlamaForQuestionAnswering: qa_outputs =
    Linear(hidden, 2); the split and the loss as BERT's."""

    def __init__(self, c):
        super().__init__()
        self.make_trunk(c)
        self.qa_outputs = nn.Linear(self.hidden(c), 2)

    def forward(self, input_ids):
        outputs = self.trunk()(input_ids)
        sequence_output = outputs[0]
        return self.qa_outputs(sequence_output)

    loss = staticmethod(BertForQuestionAnswering.loss)
    batch = staticmethod(BertForQuestionAnswering.batch)


class GPT2Trunk:
    prefix = "transformer"

    def make_trunk(self, c):
        self.transformer = GPT2Model(c)

    def trunk(self):
        return self.transformer

    @staticmethod
    def hidden(c):
        return c["n_embd"]


class GPT2ForSequenceClassification(GPT2Trunk, DecoderForSequenceClassification):
    pass


class GPT2ForTokenClassification(GPT2Trunk, DecoderForTokenClassification):
    pass


class GPT2ForQuestionAnswering(GPT2Trunk, DecoderForQuestionAnswering):
    pass


for _cls in (GPT2ForSequenceClassification, GPT2ForTokenClassification, GPT2ForQuestionAnswering):
    HF_MODELS[("gpt2", _cls.__name__)] = _cls


# ---------------------------------------------------------------- Llama, Mistral, Qwen2 (modeling_llama.py, 4.46, eager)


class LlamaRMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, c):
        super().__init__()
        dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        base = c.get("rope_theta", 10000.0)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos()
        sin = emb.sin()
        cos = cos * 1.0  # attention_scaling
        sin = sin * 1.0
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class LlamaAttention(nn.Module):
    def __init__(self, c, qkv_bias, o_bias):
        super().__init__()
        d = c["hidden_size"]
        self.num_heads = c["num_attention_heads"]
        self.head_dim = c.get("head_dim") or d // self.num_heads
        self.num_key_value_heads = c.get("num_key_value_heads", self.num_heads)
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.attention_dropout = c.get("attention_dropout", 0.0)
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d, self.num_key_value_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d, self.num_key_value_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=o_bias)

    def forward(self, hidden_states, attention_mask, position_embeddings, cache):
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        query_states = query_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        key_states = key_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if cache is not None:  # DynamicCache.update: keeps them
            cache.append((key_states, value_states))
        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
            attn_weights = attn_weights + causal_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_weights = cuda_dropout(attn_weights, self.attention_dropout, self.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, q_len, -1)
        attn_output = self.o_proj(attn_output)
        return attn_output


class LlamaMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, inner, bias = c["hidden_size"], c["intermediate_size"], c.get("mlp_bias", False)
        self.gate_proj = nn.Linear(d, inner, bias=bias)
        self.up_proj = nn.Linear(d, inner, bias=bias)
        self.down_proj = nn.Linear(inner, d, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c, qkv_bias, o_bias):
        super().__init__()
        eps = c.get("rms_norm_eps", 1e-6)
        self.self_attn = LlamaAttention(c, qkv_bias, o_bias)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = LlamaRMSNorm(c["hidden_size"], eps)
        self.post_attention_layernorm = LlamaRMSNorm(c["hidden_size"], eps)

    def forward(self, hidden_states, attention_mask, position_embeddings, cache):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, attention_mask, position_embeddings, cache)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class LlamaModel(nn.Module):
    def __init__(self, c, qkv_bias, o_bias):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([LlamaDecoderLayer(c, qkv_bias, o_bias) for _ in range(c["num_hidden_layers"])])
        self.norm = LlamaRMSNorm(c["hidden_size"], c.get("rms_norm_eps", 1e-6))
        self.rotary_emb = LlamaRotaryEmbedding(c)

    def causal_mask(self, input_tensor, cache_position, past_seen_tokens):
        # _update_causal_mask with no attention_mask, eager:
        # _prepare_4d_causal_attention_mask_with_cache_position
        dtype = input_tensor.dtype
        sequence_length = input_tensor.shape[1]
        target_length = past_seen_tokens + sequence_length + 1
        min_dtype = torch.finfo(dtype).min
        causal_mask = torch.full((sequence_length, target_length), fill_value=min_dtype, dtype=dtype)
        if sequence_length != 1:
            causal_mask = torch.triu(causal_mask, diagonal=1)
        causal_mask *= torch.arange(target_length) > cache_position.reshape(-1, 1)
        return causal_mask[None, None, :, :].expand(input_tensor.shape[0], 1, -1, -1)

    def forward(self, input_ids):
        use_cache = self.config.get("use_cache", True)
        inputs_embeds = self.embed_tokens(input_ids)
        cache = [] if use_cache else None  # DynamicCache()
        cache_position = torch.arange(0, inputs_embeds.shape[1])
        position_ids = cache_position.unsqueeze(0)
        causal_mask = self.causal_mask(inputs_embeds, cache_position, 0)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, causal_mask, position_embeddings, cache)
        hidden_states = self.norm(hidden_states)
        return hidden_states, cache


class LlamaForCausalLM(nn.Module):
    qkv_bias = o_bias = False

    def __init__(self, c):
        super().__init__()
        self.model = LlamaModel(c, self.qkv_bias or c.get("attention_bias", False),
                                self.o_bias or c.get("attention_bias", False))
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c.get("tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids):
        hidden_states, self.presents = self.model(input_ids)
        return self.lm_head(hidden_states[:, -0:, :])  # num_logits_to_keep=0: all

    loss = GPT2LMHeadModel.loss

    @staticmethod
    def batch(c, batch, seq):
        ids = torch.randint(0, c["vocab_size"], (batch, seq))
        return ((ids,), ids)


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True  # q, k and v have biases; o does not


HF_MODELS[("llama", "LlamaForCausalLM")] = LlamaForCausalLM
HF_MODELS[("mistral", "MistralForCausalLM")] = LlamaForCausalLM
HF_MODELS[("qwen2", "Qwen2ForCausalLM")] = Qwen2ForCausalLM


class LlamaTrunk:
    """LlamaModel as `model`; LlamaForQuestionAnswering and Qwen2's call it
    `transformer` (base_model_prefix), Mistral's `model`."""

    prefix = "model"
    qkv_bias = o_bias = False

    def make_trunk(self, c):
        setattr(self, self.prefix, LlamaModel(c, self.qkv_bias or c.get("attention_bias", False),
                                              self.o_bias or c.get("attention_bias", False)))

    def trunk(self):
        return getattr(self, self.prefix)

    @staticmethod
    def hidden(c):
        return c["hidden_size"]


class Qwen2Trunk(LlamaTrunk):
    qkv_bias = True


class LlamaForSequenceClassification(LlamaTrunk, DecoderForSequenceClassification):
    pass


class LlamaForTokenClassification(LlamaTrunk, DecoderForTokenClassification):
    classifier_name = "score"
    upcast = True


class LlamaForQuestionAnswering(LlamaTrunk, DecoderForQuestionAnswering):
    prefix = "transformer"


class MistralForQuestionAnswering(LlamaTrunk, DecoderForQuestionAnswering):
    pass


class Qwen2ForSequenceClassification(Qwen2Trunk, DecoderForSequenceClassification):
    pass


class Qwen2ForTokenClassification(Qwen2Trunk, DecoderForTokenClassification):
    classifier_name = "score"
    upcast = True


class Qwen2ForQuestionAnswering(Qwen2Trunk, DecoderForQuestionAnswering):
    prefix = "transformer"


for _family, _classes in (
        ("llama", {"LlamaForSequenceClassification": LlamaForSequenceClassification,
                   "LlamaForTokenClassification": LlamaForTokenClassification,
                   "LlamaForQuestionAnswering": LlamaForQuestionAnswering}),
        ("mistral", {"MistralForSequenceClassification": LlamaForSequenceClassification,
                     "MistralForTokenClassification": LlamaForTokenClassification,
                     "MistralForQuestionAnswering": MistralForQuestionAnswering}),
        ("qwen2", {"Qwen2ForSequenceClassification": Qwen2ForSequenceClassification,
                   "Qwen2ForTokenClassification": Qwen2ForTokenClassification,
                   "Qwen2ForQuestionAnswering": Qwen2ForQuestionAnswering})):
    for _arch, _cls in _classes.items():
        HF_MODELS[(_family, _arch)] = _cls
