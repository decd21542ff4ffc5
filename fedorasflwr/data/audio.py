"""MFCC features for Speech Commands, in plain torch (no torchaudio needed).

FedorAS (appendix, after Zhang et al. 2018): 40 MFCCs from a mel spectrogram of the
clip resampled to 8 kHz with 40 ms windows strided 20 ms apart, giving ``1 x 40 x 51``
for a one-second clip. Here the 16 kHz clip is analysed directly with 640-sample
(40 ms) Hann windows, a 320-sample (20 ms) hop, centred frames (51 for 16,000
samples), and 40 mel filters (HTK scale) between 20 Hz and 4 kHz - the band an
8 kHz resampling keeps, at the same 25 Hz bin spacing. Then ``log(mel + 1e-6)``, an
orthonormal DCT-II keeping 40 coefficients, and per-clip standardisation (zero
mean, unit variance), so no dataset statistics are needed.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["SAMPLE_RATE", "mfcc"]

SAMPLE_RATE = 16_000
_N_FFT, _HOP, _N_MELS, _N_MFCC = 640, 320, 40, 40
_F_MIN, _F_MAX = 20.0, 4_000.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filterbank(
    num_mels: int = _N_MELS, n_fft: int = _N_FFT, sample_rate: int = SAMPLE_RATE
) -> torch.Tensor:
    """Triangular mel filters ``(n_fft // 2 + 1, num_mels)`` between 20 Hz and 4 kHz."""
    freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(_F_MIN), _hz_to_mel(_F_MAX), num_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs[None, :] - lower) / (centre - lower)
    falling = (upper - freqs[None, :]) / (upper - centre)
    return torch.from_numpy(np.maximum(0.0, np.minimum(rising, falling)).T.astype(np.float32))


def dct_matrix(num_coefficients: int = _N_MFCC, num_mels: int = _N_MELS) -> torch.Tensor:
    """Orthonormal DCT-II ``(num_mels, num_coefficients)``."""
    n = np.arange(num_mels)[:, None]
    k = np.arange(num_coefficients)[None, :]
    basis = np.cos(math.pi / num_mels * (n + 0.5) * k) * math.sqrt(2.0 / num_mels)
    basis[:, 0] /= math.sqrt(2.0)
    return torch.from_numpy(basis.astype(np.float32))


def mfcc(waveforms: torch.Tensor) -> torch.Tensor:
    """``(N, 1, 40, 51)`` float32 MFCCs of ``(N, samples)`` 16 kHz clips.

    Clips are zero-padded or cut to one second (16,000 samples) first.
    """
    waveforms = waveforms.to(torch.float32)
    if waveforms.shape[1] < SAMPLE_RATE:
        waveforms = torch.nn.functional.pad(waveforms, (0, SAMPLE_RATE - waveforms.shape[1]))
    spectrum = torch.stft(
        waveforms[:, :SAMPLE_RATE],
        n_fft=_N_FFT,
        hop_length=_HOP,
        window=torch.hann_window(_N_FFT),
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )
    power = spectrum.abs().pow(2).transpose(1, 2)  # (N, frames, bins)
    log_mel = torch.log(power @ mel_filterbank() + 1e-6)
    coefficients = (log_mel @ dct_matrix()).transpose(1, 2)  # (N, 40, frames)
    mean = coefficients.mean(dim=(1, 2), keepdim=True)
    std = coefficients.std(dim=(1, 2), keepdim=True).clamp_min(1e-6)
    return ((coefficients - mean) / std).unsqueeze(1)
