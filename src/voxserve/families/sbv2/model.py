"""Style-Bert-VITS2 (SBV2) synthesizer for inference: modules and a dims dataclass only.

Both variants of SBV2 2.x: **JP-Extra** (one Japanese BERT input) and the **multilingual**
model (ZH / JP / EN BERT inputs). Parameter names follow SBV2's `net_g` checkpoints (see
loader.py) so a folded state dict loads with `load_state_dict`.

What SBV2 shares with VITS is imported from the VITS layers it shares with Piper (models/vits.py):
relative-position attention, FFN, LayerNorm, the deterministic and stochastic duration
predictors, Flip, the HiFi-GAN generator, the gather-based hard alignment. What differs lives
here:

- text encoder input: (phone + tone + language embeddings + BERT projection(s) + style
  projection) * sqrt(H); the speaker embedding is added (through `spk_emb_linear`) before
  encoder layer `cond_layer_idx` (2);
- durations: logw = sdp * sdp_ratio + dp * (1 - sdp_ratio), both predictors always present
  (dp's filter is 256, sdp's is H);
- the flow is a transformer coupling block (mean-only coupling layers whose conditioning net is
  a relative-attention encoder with its own speaker input at layer 2), not WaveNet.

Shapes: B batch, T text positions (blanks interspersed), F frames, S = F * hop samples,
H hidden, C inter channels. Masks are float 0/1 [B, 1, T] / [B, 1, F]. Every convolution's
input is masked where its row ends, so a padded batch computes what each row computes alone
(the decoder too: HiFi-GAN runs with the frame mask upsampled to samples).

Noise: each row draws its own noise, of its own length, from its own generator (CPU, so the
same seed gives the same audio on any device and in any batch). noise_scale = noise_scale_w =
0 (or sdp_ratio = 0 for the duration noise) makes synthesis deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ...models.vits import (
    DurationPredictor,
    Encoder,
    Flip,
    Generator,
    RelativeMultiHeadAttention,
    StochasticDurationPredictor,
    VitsDims,
    VitsModel,
    _softmax32,
    dtype_of,
    sequence_mask,
)
from ...runtime import attention

BERT_DIM = 1024  # hard-coded in SBV2 (its BERT projections are Conv1d(1024, H, 1))
STYLE_DIM = 256  # hard-coded in SBV2 (style_proj is Linear(256, H))
LANGUAGES = ("ZH", "JP", "EN")  # SBV2's language ids 0, 1, 2
# multilingual text encoder: which projection takes which language's BERT features
BERT_PROJ = {"ZH": "bert_proj", "JP": "ja_bert_proj", "EN": "en_bert_proj"}


@dataclass(frozen=True)
class Sbv2Dims:
    """Every size of an SBV2 generator (net_g less the training-only posterior encoder)."""

    jp_extra: bool
    n_vocab: int = 112
    n_tones: int = 12
    n_languages: int = 3
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    window_size: int = 4
    inter_channels: int = 192
    cond_layer_idx: int = 2  # the text encoder layer the speaker embedding enters before
    # duration predictors: dp's filter is hard-coded 256; sdp's filter is H whatever is passed
    dp_filter_channels: int = 256
    dp_kernel_size: int = 3
    sdp_n_flows: int = 4
    # transformer coupling flow
    flow_n_flows: int = 4
    flow_n_layers: int = 6  # n_layers_trans_flow: 6 in JP-Extra, 4 in the multilingual model
    flow_kernel_size: int = 5
    # HiFi-GAN
    resblock: str = "1"
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_rates: tuple[int, ...] = (8, 8, 2, 2, 2)
    upsample_initial_channel: int = 512
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8, 2, 2)
    # speakers
    n_speakers: int = 1
    gin_channels: int = 256
    spk_conditioned_encoder: bool = True

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)

    @property
    def bert_languages(self) -> tuple[str, ...]:
        """The languages with a BERT input: JP-Extra has one (JP), the multilingual model three."""
        return ("JP",) if self.jp_extra else LANGUAGES

    @property
    def enc_gin_channels(self) -> int:
        return self.gin_channels if self.spk_conditioned_encoder else 0

    def vits(self, **overrides) -> VitsDims:
        """The VitsDims a shared Piper module is built from."""
        base = dict(
            n_vocab=self.n_vocab, hidden_channels=self.hidden_channels,
            filter_channels=self.filter_channels, n_heads=self.n_heads, n_layers=self.n_layers,
            kernel_size=self.kernel_size, window_size=self.window_size,
            inter_channels=self.inter_channels, dp_kernel_size=self.dp_kernel_size,
            dp_n_flows=self.sdp_n_flows, resblock=self.resblock,
            resblock_kernel_sizes=tuple(self.resblock_kernel_sizes),
            resblock_dilation_sizes=tuple(tuple(d) for d in self.resblock_dilation_sizes),
            upsample_rates=tuple(self.upsample_rates),
            upsample_initial_channel=self.upsample_initial_channel,
            upsample_kernel_sizes=tuple(self.upsample_kernel_sizes),
            n_speakers=self.n_speakers, gin_channels=self.gin_channels,
        )
        base.update(overrides)
        return VitsDims(**base)


# --------------------------------------------------------------------------- encoders

# The most attention scores (B * heads * query rows * keys) one step holds. The flow attends
# over frames, and a sentence near the limit is ~10k frames (hop 512; more at a small hop): its
# full [B, heads, F, F] scores would grow with F squared, so longer sequences attend in query
# chunks against all keys (the same softmax per row, so the same result): O(F * chunk) memory.
SCORE_BLOCK = attention.SCORE_BLOCK  # past it the flow attends by rows of queries (runtime/attention.py)


def attend_in_query_chunks(attn: RelativeMultiHeadAttention, x: torch.Tensor, x_mask: torch.Tensor,
                           rows: int) -> torch.Tensor:
    """`attn(x, attn_mask)` (its banded form), computed `rows` queries at a time against every key.

    x [B, C, T], x_mask [B, 1, T] -> [B, C, T]; no [T, T] tensor exists: each step's scores are
    [B, H, rows, T]. Row i's weights are the softmax of its own scores, so chunking rows changes
    nothing but float rounding (tests check it against the plain path)."""
    b, c, t = x.shape
    h, d, w = attn.n_heads, attn.k_channels, attn.window_size
    q = attn.conv_q(x).view(b, h, d, t).transpose(2, 3) / math.sqrt(d)  # [B, H, T, d]
    k = attn.conv_k(x).view(b, h, d, t).transpose(2, 3)
    v = attn.conv_v(x).view(b, h, d, t).transpose(2, 3)
    kt = k.transpose(-2, -1)  # [B, H, d, T]
    key_mask = x_mask.unsqueeze(2)  # [B, 1, 1, T]
    outs = []
    for i0 in range(0, t, rows):
        i1 = min(t, i0 + rows)
        qc = q[:, :, i0:i1]  # [B, H, c, d]
        scores = torch.matmul(qc, kt)  # [B, H, c, T]
        rel_logits = torch.matmul(qc, attn.emb_rel_k.transpose(-2, -1))  # [B, H, c, 2w+1]
        diags = []
        for r in range(-w, w + 1):  # query i0 + j meets key i0 + j + r: diagonal i0 + r of the block
            j0 = max(0, -(i0 + r))
            n = scores.diagonal(offset=i0 + r, dim1=-2, dim2=-1).shape[-1]
            if n > 0:
                diags.append((r, j0, n))
                scores.diagonal(offset=i0 + r, dim1=-2, dim2=-1).add_(rel_logits[:, :, j0 : j0 + n, r + w])
        mask = x_mask[:, :, i0:i1].unsqueeze(-1) * key_mask  # [B, 1, c, T]
        p = _softmax32(scores.masked_fill(mask == 0, -1e4))
        out = torch.matmul(p, v)  # [B, H, c, d]
        band = p.new_zeros(b, h, i1 - i0, 2 * w + 1)  # band[..., j, r + w] = p[..., j, i0 + j + r]
        for r, j0, n in diags:
            band[:, :, j0 : j0 + n, r + w] = p.diagonal(offset=i0 + r, dim1=-2, dim2=-1)
        outs.append(out + torch.matmul(band, attn.emb_rel_v))
        del scores, p, mask
    return attn.conv_o(torch.cat(outs, dim=2).transpose(2, 3).reshape(b, c, t))


class ConditionedEncoder(Encoder):
    """Piper's relative-attention encoder plus SBV2's speaker input: before layer
    `cond_layer_idx`, x += spk_emb_linear(g) (then masked). Without gin it is Piper's encoder."""

    def __init__(self, dims: VitsDims, gin_channels: int, cond_layer_idx: int = 2):
        super().__init__(dims)
        self.cond_layer_idx = dims.n_layers
        if gin_channels:
            if not cond_layer_idx < dims.n_layers:
                raise ValueError(f"the speaker enters before layer {cond_layer_idx}: needs more than {cond_layer_idx} layers")
            self.cond_layer_idx = cond_layer_idx
            self.spk_emb_linear = nn.Linear(gin_channels, dims.hidden_channels)

    score_block = SCORE_BLOCK  # the most scores one attention step holds (tests lower it)

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        # x [B, H, L], x_mask [B, 1, L], g [B, gin, 1] -> [B, H, L]
        b, _, length = x.shape
        heads = self.attn_layers[0].n_heads
        rows = attention.query_rows(b * heads, length, length, self.score_block)
        chunked = rows < length and all(a.impl == "banded" for a in self.attn_layers)
        attn_mask = None if chunked else x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)  # [B, 1, L, L]
        x = x * x_mask
        for i, (attn, norm1, ffn, norm2) in enumerate(
            zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2)
        ):
            if i == self.cond_layer_idx and g is not None:
                x = (x + self.spk_emb_linear(g.transpose(1, 2)).transpose(1, 2)) * x_mask
            y = attend_in_query_chunks(attn, x, x_mask, rows) if chunked else attn(x, attn_mask)
            x = norm1(x + y)
            x = norm2(x + ffn(x, x_mask))
        return x * x_mask


class TextEncoder(nn.Module):
    """Phones, tones, languages, BERT features and the style vector -> x and prior stats."""

    def __init__(self, dims: Sbv2Dims):
        super().__init__()
        h = dims.hidden_channels
        self.hidden_channels = h
        self.out_channels = dims.inter_channels
        self.languages = dims.bert_languages
        self.emb = nn.Embedding(dims.n_vocab, h)
        self.tone_emb = nn.Embedding(dims.n_tones, h)
        self.language_emb = nn.Embedding(dims.n_languages, h)
        if dims.jp_extra:
            self.bert_proj = nn.Conv1d(BERT_DIM, h, 1)  # JP-Extra's one projection takes JP features
        else:
            for lang in LANGUAGES:
                setattr(self, BERT_PROJ[lang], nn.Conv1d(BERT_DIM, h, 1))
        self.style_proj = nn.Linear(STYLE_DIM, h)
        self.encoder = ConditionedEncoder(dims.vits(), dims.enc_gin_channels, dims.cond_layer_idx)
        self.proj = nn.Conv1d(h, dims.inter_channels * 2, 1)

    def projection(self, lang: str) -> nn.Conv1d:
        return self.bert_proj if len(self.languages) == 1 else getattr(self, BERT_PROJ[lang])

    def forward(self, x, x_mask, tone, language, bert: Mapping[str, torch.Tensor], style_vec, g=None):
        # x, tone, language [B, T] int64; x_mask [B, 1, T]; bert {lang: [B, 1024, T]};
        # style_vec [B, 256]; g [B, gin, 1] | None -> x [B, H, T], m_p / logs_p [B, C, T]
        unknown = set(bert) - set(self.languages)
        if unknown:
            raise ValueError(f"this model has no BERT input for {sorted(unknown)} (it takes {list(self.languages)})")
        h = self.emb(x) + self.tone_emb(tone) + self.language_emb(language)  # [B, T, H]
        for lang in self.languages:  # SBV2's order: ZH (bert), JP (ja_bert), EN (en_bert)
            proj = self.projection(lang)
            feats = bert.get(lang)
            if feats is None:  # SBV2 feeds zeros: the projection of zeros is its bias
                h = h + proj.bias.view(1, 1, -1)
            else:
                h = h + proj(feats).transpose(1, 2)
        h = h + self.style_proj(style_vec.unsqueeze(1))  # [B, 1, H], the same at every position
        h = (h * math.sqrt(self.hidden_channels)).transpose(1, -1)  # [B, H, T]
        h = self.encoder(h * x_mask, x_mask, g=g)
        stats = self.proj(h) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return h, m, logs


# --------------------------------------------------------------------------- flow


class TransformerCouplingLayer(nn.Module):
    """Mean-only affine coupling whose conditioning net is a speaker-conditioned attention encoder."""

    def __init__(self, dims: Sbv2Dims):
        super().__init__()
        self.half = dims.inter_channels // 2
        h = dims.hidden_channels
        self.pre = nn.Conv1d(self.half, h, 1)
        enc_dims = dims.vits(n_layers=dims.flow_n_layers, kernel_size=dims.flow_kernel_size)
        self.enc = ConditionedEncoder(enc_dims, dims.gin_channels, dims.cond_layer_idx)
        self.post = nn.Conv1d(h, self.half, 1)

    def reverse(self, x, x_mask, g=None):
        # x [B, C, F] -> [B, C, F]
        x0, x1 = torch.split(x, [self.half] * 2, 1)
        h = self.pre(x0) * x_mask
        h = self.enc(h, x_mask, g=g)
        m = self.post(h) * x_mask
        return torch.cat([x0, (x1 - m) * x_mask], 1)  # logs = 0: exp(-0) = 1


class TransformerCouplingBlock(nn.Module):
    def __init__(self, dims: Sbv2Dims):
        super().__init__()
        flows: list[nn.Module] = []
        for _ in range(dims.flow_n_flows):
            flows.append(TransformerCouplingLayer(dims))
            flows.append(Flip())  # checkpoint indices: couplings at 0, 2, 4, 6
        self.flows = nn.ModuleList(flows)

    def reverse(self, x, x_mask, g=None):
        for flow in reversed(self.flows):
            x = flow.reverse(x, x_mask, g=g)
        return x


# --------------------------------------------------------------------------- the model


def _per_row(value, b: int, name: str) -> torch.Tensor:
    """A float or [B] sequence/tensor -> float32 [B] (CPU)."""
    t = torch.as_tensor(value, dtype=torch.float32).flatten().cpu()
    if t.numel() == 1:
        return t.expand(b).clone()
    if t.numel() != b:
        raise ValueError(f"{name}: expected one value or {b}, got {t.numel()}")
    return t


def make_generators(b: int, seeds: Sequence[int | None] | None = None,
                    generators: Sequence[torch.Generator | None] | None = None) -> list[torch.Generator | None]:
    """One CPU generator per row: from `generators`, else from `seeds` (None = unseeded)."""
    if generators is not None:
        if len(generators) != b:
            raise ValueError(f"generators: expected {b}, got {len(generators)}")
        return list(generators)
    if seeds is None:
        return [None] * b
    if len(seeds) != b:
        raise ValueError(f"seeds: expected {b}, got {len(seeds)}")
    out: list[torch.Generator | None] = []
    for s in seeds:
        if s is None:
            out.append(None)
        else:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(int(s))
            out.append(gen)
    return out


def row_noise(shape_per_row: Sequence[tuple[int, int]], full: tuple[int, int, int], scales: torch.Tensor,
              generators: Sequence[torch.Generator | None], device, dtype) -> torch.Tensor:
    """[B, c, L] of standard normal noise * scale, row i drawn as [c, L_i] from its own
    generator and zero-padded: a row's noise does not depend on its batch mates."""
    out = torch.zeros(full, dtype=torch.float32)
    for i, ((c, n), gen, s) in enumerate(zip(shape_per_row, generators, scales.tolist())):
        if s != 0.0 and n > 0:
            out[i, :c, :n] = torch.randn(c, n, generator=gen) * s
    return out.to(device=device, dtype=dtype)


@dataclass
class Sbv2Output:
    wave: torch.Tensor  # [B, 1, S_max] float, zero past each row's end
    wave_lengths: torch.Tensor  # [B] samples (frames * hop)
    durations: torch.Tensor  # [B, T] frames per text position (0 on padding)
    frame_lengths: torch.Tensor  # [B]
    stages: dict[str, torch.Tensor] = field(default_factory=dict)  # m_p, logs_p (expanded), z: [B, C, F]
    over_limit: list[int] = field(default_factory=list)
    """Rows whose predicted frames passed `max_frames`: not generated (one frame of output)."""
    predicted_frames: list[int] = field(default_factory=list)  # [B] before any row was cut


class Sbv2Synthesizer(nn.Module):
    """SBV2's net_g for inference (no posterior encoder). Parameter names follow SBV2 checkpoints."""

    def __init__(self, dims: Sbv2Dims):
        super().__init__()
        self.dims = dims
        self.enc_p = TextEncoder(dims)
        self.sdp = StochasticDurationPredictor(dims.vits(dp_filter_channels=dims.hidden_channels))
        self.dp = DurationPredictor(dims.vits(dp_filter_channels=dims.dp_filter_channels))
        self.flow = TransformerCouplingBlock(dims)
        self.dec = Generator(dims.vits())
        self.emb_g = nn.Embedding(dims.n_speakers, dims.gin_channels)

    # -- stages ---------------------------------------------------------------

    def speaker_embedding(self, sid: torch.Tensor) -> torch.Tensor:
        """[B] speaker ids -> g [B, gin, 1]."""
        return self.emb_g(sid).unsqueeze(-1)

    def encode(self, x, x_lengths, tone, language, bert, style_vec, g, dur_noise,
               length_scale: torch.Tensor, sdp_ratio: torch.Tensor):
        """Text -> prior stats and integer durations.

        x, tone, language [B, T]; x_lengths [B]; bert {lang: [B, 1024, T]}; style_vec [B, 256];
        g [B, gin, 1]; dur_noise [B, 2, T] (standard normal x noise_scale_w, zeros = none);
        length_scale, sdp_ratio [B]. Returns m_p, logs_p [B, C, T], x_mask [B, 1, T],
        durations [B, T] (float frames, 0 on padding).
        """
        x_mask = sequence_mask(x_lengths, x.shape[1]).unsqueeze(1).to(style_vec.dtype)
        g_enc = g if self.dims.spk_conditioned_encoder else None
        h, m_p, logs_p = self.enc_p(x, x_mask, tone, language, bert, style_vec, g=g_enc)
        r = sdp_ratio.to(h.device, h.dtype).view(-1, 1, 1)
        logw = self.dp(h, x_mask, g) * (1 - r)  # [B, 1, T]
        if bool((sdp_ratio != 0).any()):  # SBV2: sdp * r + dp * (1 - r); r = 0 adds exactly 0
            logw = self.sdp(h, x_mask, g, dur_noise) * r + logw
        w = torch.exp(logw) * x_mask * length_scale.to(h.device, h.dtype).view(-1, 1, 1)
        return m_p, logs_p, x_mask, torch.ceil(w).squeeze(1)

    frame_lengths = staticmethod(VitsModel.frame_lengths)  # [B, T] -> [B], at least 1
    expand = staticmethod(VitsModel.expand)  # durations -> frame-level m, logs [B, C, F], y_mask

    def flow_reverse(self, m, logs, y_mask, z_noise, g):
        """Prior sample -> latent z [B, C, F] (zero past each row's end), in the flow's dtype."""
        dt = dtype_of(self.flow)
        z_p = m.to(dt) + z_noise.to(dt) * torch.exp(logs.to(dt))
        y_mask = y_mask.to(dt)
        return self.flow.reverse(z_p, y_mask, g=g.to(dt)) * y_mask

    def decode(self, z, y_mask, g):
        """z [B, C, F] -> wave [B, 1, F * hop] in the decoder's dtype; the mask keeps every row
        to its own length."""
        dt = dtype_of(self.dec)
        return self.dec(z.to(dt), y_mask.to(dt), g.to(dt))

    # -- all of it ------------------------------------------------------------

    @torch.no_grad()
    def infer(
        self,
        x: torch.Tensor,
        x_lengths: torch.Tensor,
        tone: torch.Tensor,
        language: torch.Tensor,
        bert: Mapping[str, torch.Tensor],
        style_vec: torch.Tensor,
        sid: torch.Tensor,
        noise_scale=0.6,
        length_scale=1.0,
        noise_scale_w=0.8,
        sdp_ratio=0.2,
        seeds: Sequence[int | None] | None = None,
        generators: Sequence[torch.Generator | None] | None = None,
        keep_stages: bool = False,
        max_frames: Sequence[int] | None = None,
    ) -> Sbv2Output:
        """SBV2's `net_g.infer` for a padded batch.

        x, tone, language [B, T] int64 (blanks interspersed as the model was trained);
        x_lengths [B]; bert: {"JP": [B, 1024, T]} for JP-Extra, any of "ZH"/"JP"/"EN" for the
        multilingual model (a missing language is SBV2's zeros); style_vec [B, 256];
        sid [B]. The scalars are floats or [B] (per row); their defaults are SBV2's (noise 0.6,
        noise_w 0.8, sdp_ratio 0.2, length 1.0). seeds / generators: one per row (the
        noise of row i is drawn from its own generator, so it does not depend on the batch).
        max_frames: per row, the most frames it may make; a row predicted longer is not run
        past its durations (it gets one frame) and is listed in `over_limit`, so a bound on a
        sentence's audio holds before the flow and decoder allocate for it.
        """
        b, t = x.shape
        dev = x.device
        dt = style_vec.dtype
        gens = make_generators(b, seeds, generators)
        noise_scale = _per_row(noise_scale, b, "noise_scale")
        length_scale = _per_row(length_scale, b, "length_scale")
        noise_scale_w = _per_row(noise_scale_w, b, "noise_scale_w")
        sdp_ratio = _per_row(sdp_ratio, b, "sdp_ratio")
        lengths = x_lengths.tolist()

        g = self.speaker_embedding(sid.to(dev))  # [B, gin, 1]
        # every row draws its duration noise first, then its prior noise, from its generator
        dur_scale = torch.where(sdp_ratio != 0, noise_scale_w, torch.zeros_like(noise_scale_w))
        dur_noise = row_noise([(2, n) for n in lengths], (b, 2, t), dur_scale, gens, dev, dt)
        m_p, logs_p, x_mask, durations = self.encode(
            x, x_lengths.to(dev), tone, language, bert, style_vec, g, dur_noise, length_scale, sdp_ratio
        )
        y_lengths = self.frame_lengths(durations)  # [B]
        frames = y_lengths.tolist()  # the one device -> host read
        predicted = list(frames)
        over = [] if max_frames is None else [i for i, (n, m) in enumerate(zip(frames, max_frames)) if n > m]
        if over:
            durations = durations.clone()
            durations[over] = 0
            y_lengths = self.frame_lengths(durations)
            frames = y_lengths.tolist()
        n_frames = max(frames)
        m, logs, y_mask = self.expand(m_p, logs_p, durations, y_lengths, n_frames)
        c = m.shape[1]
        z_noise = row_noise([(c, n) for n in frames], (b, c, n_frames), noise_scale, gens, dev, dt)
        z = self.flow_reverse(m, logs, y_mask, z_noise, g)
        wave = self.decode(z, y_mask, g)  # [B, 1, F * hop]
        stages = {"m_p": m, "logs_p": logs, "z": z} if keep_stages else {}
        return Sbv2Output(wave, y_lengths * self.dims.hop_length, durations, y_lengths, stages, over, predicted)
