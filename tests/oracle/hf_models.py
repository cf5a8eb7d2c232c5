"""Hugging Face models written as plain PyTorch modules, op for op as
transformers' modeling files (4.4x, eager attention) write them, for the
oracle (torch_oracle.py). No transformers package is needed: each class
names the transformers class it follows; the comments name what decides
memory. Dropout is CUDA's fused kernel (torch_oracle.Dropout)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from cuda_kernels import Dropout


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

    def forward(self, hidden_states, attention_mask):
        for layer in self.layer:
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


HF_MODELS = {
    ("bert", "BertForPreTraining"): BertForPreTraining,
    ("bert", "BertForMaskedLM"): BertForMaskedLM,
    ("bert", "BertForSequenceClassification"): BertForSequenceClassification,
    ("bert", "BertForTokenClassification"): BertForTokenClassification,
    ("roberta", "RobertaForMaskedLM"): RobertaForMaskedLM,
    ("roberta", "RobertaForSequenceClassification"): RobertaForSequenceClassification,
    ("roberta", "RobertaForTokenClassification"): RobertaForTokenClassification,
}
