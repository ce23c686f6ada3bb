"""Elementwise math, activations, initializers and dtype shorthands (torch names and defaults).

`ElementwiseOps` is a mixin that `Tensor` inherits; like tensor/composite.py, every method is a composition of the core
ops, so it stays lazy and fuses like any other graph.

Numerics. Inputs are float32/float64 as given; ints and bools are computed as float32 (torch's rule), float16 and
bfloat16 in float32 and rounded once (`_in_float32`). Formulations avoid cancellation and overflow over the whole
domain (the methods say how), and NaN, +-inf and -0.0 come out as numpy gives them.

Gradients. Autograd differentiates the formulas as written, and `where` sends a zero gradient into the branch it
does not take; zero times an infinite local derivative would still be NaN there. So every branch is evaluated on a
safe input (`cond.where(x, safe)`), never on the values another branch handles: `elu(1000)` does not differentiate
`expm1(1000)`, `atan(0)` does not differentiate `1 / 0`."""
from __future__ import annotations
import math

from baregrad.compiler.dtype import dtypes, to_dtype
from .composite import _in_float32, _norm_dim, DTypeError
from .device_dtypes import widest_float

LN2 = math.log(2.0)
LOG10_2 = math.log10(2.0)
PI = math.pi
SELU_ALPHA = 1.6732632423543772848170429916717   # Klambauer et al., "Self-Normalizing Neural Networks" (2017)
SELU_SCALE = 1.0507009873554804934193349852946
QUICK_GELU = 1.702                               # Hendrycks & Gimpel (2016), sigmoid approximation of gelu
BIG = 2.0 ** 28   # beyond this x*x + 1 == x*x in float64 too: asinh(x) = log(2x), acosh(x) = log(2x)

# atan on [0, tan(pi/8)] (float32) and [0, 0.66] (float64): Cephes Math Library (S. L. Moshier), atanf.c and
# atan.c. float32: x + x*z*P(z) with z = x*x; float64: x + x*z*P(z)/Q(z). Highest power first.
ATAN_F32 = [8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1]
ATAN_F64_P = [-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
              -1.228866684490136173410e2, -6.485021904942025371773e1]
ATAN_F64_Q = [1.0, 2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
              4.853903996359136964868e2, 1.945506571482613964425e2]
ATAN_F64_MOREBITS = 6.123233995736765886130e-17   # pi/2 - float64(pi/2), from atan.c
TAN_3PI_8 = 2.414213562373095048802

# ln 2 split for exp's argument reduction, so that n * LN2_HI is exact for the n that occur (fdlibm's ln2_hi/ln2_lo
# for float64; float32's keeps 16 significant bits)
LN2_SPLIT = {8: (6.93147180369123816490e-01, 1.90821492927058770002e-10),
             4: (0.693145751953125, 1.428606765330187045e-06)}
# beyond these, exp(x) is inf or 0 in the dtype (clamping keeps n finite)
EXP_CLAMP = {8: 1100.0, 4: 200.0}

# Taylor series on |x| < 1 (sinh) and |x| < 1/2 (expm1): coefficients 1/(2k+1)! and 1/(k+1)!, enough terms for
# float64 (the first term left out is below 2^-60 relative)
SINH_SERIES = [1.0 / math.factorial(2 * k + 1) for k in range(10, -1, -1)]
EXPM1_SERIES = [1.0 / math.factorial(k + 1) for k in range(16, -1, -1)]


def _poly(x, coeffs):
  """Horner: coeffs from the highest power down to the constant term."""
  acc = x * coeffs[0] + coeffs[1]
  for c in coeffs[2:]: acc = acc * x + c
  return acc


class ElementwiseOps:
  """Mixed into `Tensor`."""

  # ---------------------------------------------------------------- helpers

  def _odd(self, fn):
    """An odd function from its values on |x|: fn(|x|) with x's sign, and x itself at +-0 (keeps -0.0; the
    gradient there is 1, which is f'(0) for every odd function used here: asin, atan, sinh, asinh, atanh)."""
    r = fn(self.abs())
    return (self == 0).where(self, (self < 0).where(-r, r))

  def _signbit(self):
    """True where the sign bit is set (-0.0 and negative NaNs included): the float bits read as a signed int."""
    ints = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}
    return self.bitcast(ints[self.dtype.itemsize]) < 0

  def _float_operands(self, other, reverse=False):
    """self and other promoted (ints and bools to float32) and broadcast."""
    return self._operands(other, reverse, lambda d: d if d.is_float else dtypes.default_float)

  def _exp(self):
    """exp(x) for float32/float64 within ~2 ulp everywhere: x = n ln2 + r with |r| <= ln2/2 (Cody-Waite), then
    exp2(r / ln2) * 2^n with 2^n exact (two halves, so no factor overflows before the result does). A plain
    exp2(x / ln2) loses the bits of x / ln2's rounding: ~30 ulp at x = 80 (float32), ~140 at x = 700 (float64)."""
    hi, lo = LN2_SPLIT[self.dtype.itemsize]
    lim = EXP_CLAMP[self.dtype.itemsize]
    x = self.clip(-lim, lim)
    n = (x * (1 / LN2) + 0.5).floor()
    r = (x - n * hi) - n * lo
    half = (n * 0.5).floor()
    return (r * (1 / LN2)).exp2() * half.exp2() * (n - half).exp2()

  # ---------------------------------------------------------------- sign, bits, remainders

  def neg(self):
    """-x (bool raises, as in torch)."""
    return -self

  def bitwise_not(self):
    """~x for ints; logical not for bool. Floats raise TypeError."""
    return ~self

  def _shift(self, other, left: bool, reverse: bool = False):
    a, b = self._operands(other, reverse)
    op = "lshift" if left else "rshift"
    if a.dtype.is_float: raise DTypeError(f"{op}: needs integer or bool tensors, got {a.dtype.name}")
    if a.dtype.is_bool: a, b = a.cast(dtypes.int8), b.cast(dtypes.int8)
    return a << b if left else a >> b

  def lshift(self, other):
    """x << other for ints (numpy/torch: a shift by an amount outside [0, bits) gives 0)."""
    return self._shift(other, True)

  def rshift(self, other):
    """x >> other for ints, arithmetic for signed ones (an amount outside [0, bits) gives 0, or -1 for a negative x)."""
    return self._shift(other, False)

  bitwise_left_shift, bitwise_right_shift = lshift, rshift

  def fmod(self, other):
    """C's fmod: the remainder of x / other truncated, with the sign of x (torch.fmod, numpy.fmod). Floats: exact;
    fmod(x, 0) and fmod(+-inf, y) are NaN, fmod(x, +-inf) is x; the gradient is torch's (1, -trunc(x / other)).
    Ints: C's %, and x % 0 gives 0 (numpy; torch raises)."""
    from baregrad.compiler.uop import Ops
    a, b = self._operands(other)
    if a.dtype.is_bool: a, b = a.cast(dtypes.int8), b.cast(dtypes.int8)
    exact = a._alu(Ops.MOD, b)
    if not a.dtype.is_float: return exact
    return exact._differentiated_as(a - b * (a / b).trunc())

  def _differentiated_as(self, surrogate):
    """self's values with surrogate's gradient (surrogate equals self up to rounding): self + (s - s.detach()),
    and self alone where that sum could change it (+-0.0, whose sign + 0 would lose, or a non-finite s)."""
    keep = (self == 0) | surrogate.isfinite().logical_not()
    return keep.where(self, self + (surrogate - surrogate.detach()))

  def copysign(self, other):
    """|x| with the sign bit of other (-0.0 and negative NaNs count as negative). Ints give float32, as in torch.
    The gradient is torch's: out / x for x, 0 where x is +-0, and 0 for other."""
    a, b = self._float_operands(other)
    shape = tuple(type(self)._broadcast_shape(tuple(a.shape), tuple(b.shape)))
    a, b = a.expand(*shape), b.expand(*shape)
    out = (a._signbit() != b._signbit()).where(-a, a)
    return out._with_gradient((a, b), lambda o, g, x, _: (g * (x == 0).where(0.0, o.detach() / x.detach()), None))

  # ---------------------------------------------------------------- logarithms and exponentials

  @_in_float32
  def log10(self):
    return self._float().log2() * LOG10_2

  @_in_float32
  def log1p(self):
    """log(1 + x), accurate for small x: 2*atanh(s) with s = x / (2 + x) as a series for |x| < 1/4, log(1 + x)
    elsewhere (where 1 + x loses nothing that matters)."""
    x = self._float()
    small = x.abs() < 0.25
    xs = small.where(x, 0.0)
    s = xs / (xs + 2)
    terms = 12 if x.dtype == dtypes.float64 else 6
    series = _poly(s * s, [1.0 / (2 * k + 1) for k in range(terms - 1, -1, -1)])
    return small.where(2 * s * series, (small.where(1.0, x) + 1).log())

  @_in_float32
  def expm1(self):
    """exp(x) - 1, accurate for small x: a Taylor series for |x| < 1/2, exp(x) - 1 elsewhere."""
    x = self._float()
    small = x.abs() < 0.5
    xs = small.where(x, 0.0)
    return small.where(xs * _poly(xs, EXPM1_SERIES), small.where(1.0, x)._exp() - 1)

  def logaddexp(self, other):
    """log(exp(x) + exp(other)) without overflow: max + log1p(exp(-|x - other|)). Equal infinities give themselves."""
    a, b = self._float_operands(other)
    d = (a == b).where(0.0, a - b)   # inf - inf would be NaN
    return a.maximum(b) + (-d.abs())._exp().log1p()

  # ---------------------------------------------------------------- classification

  def isnan(self):
    return self != self if self.dtype.is_float else self.full_like(False, dtype=dtypes.bool)

  def isinf(self, detect_positive=True, detect_negative=True):
    """x is +inf (with detect_positive) or -inf (with detect_negative); ints and bools are never infinite."""
    if not self.dtype.is_float or not (detect_positive or detect_negative): return self.full_like(False, dtype=dtypes.bool)
    if detect_positive and detect_negative: return self.abs() == math.inf
    return self == (math.inf if detect_positive else -math.inf)

  def isfinite(self):
    return self.abs() < math.inf if self.dtype.is_float else self.full_like(True, dtype=dtypes.bool)

  def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """torch.isclose: x == other, or both finite with |x - other| <= atol + rtol * |other|; NaNs are close to each
    other only with equal_nan. Ints and bools compare their difference in float64 (exact below 2**53; float32 on a
    device without float64)."""
    if rtol < 0 or atol < 0: raise ValueError(f"isclose: rtol ({rtol}) and atol ({atol}) must be non-negative")
    a, b = self._operands(other)
    close = a == b
    if a.dtype.is_float and equal_nan: close = close | (a.isnan() & b.isnan())
    if rtol == 0 and atol == 0: return close
    if not a.dtype.is_float: a, b = a.cast(widest_float(a.device)), b.cast(widest_float(a.device))
    err = (a - b).abs()
    return close | (err.isfinite() & (err <= atol + rtol * b.abs()))

  # ---------------------------------------------------------------- inverse trigonometric

  def _atan_nonneg(self):
    """atan(a) for a >= 0 (or NaN), float32 or float64: Cephes' reduction to a small argument (module constants)."""
    f64 = self.dtype == dtypes.float64
    big = self > TAN_3PI_8
    mid = (self > (0.66 if f64 else math.tan(PI / 8))) & big.logical_not()
    inv = -(big.where(self, 1.0).reciprocal())                                   # atan(a) = pi/2 + atan(-1/a)
    shifted = (mid.where(self, 0.0) - 1) / (mid.where(self, 0.0) + 1)            # atan(a) = pi/4 + atan((a-1)/(a+1))
    x = big.where(inv, mid.where(shifted, self))
    z = x * x
    if f64: core = x + x * z * _poly(z, ATAN_F64_P) / _poly(z, ATAN_F64_Q)
    else: core = x + x * z * _poly(z, ATAN_F32)
    def const(v): return self._scalar(v, self.dtype)
    base = big.where(const(PI / 2), mid.where(const(PI / 4), 0.0))
    if f64: core = core + big.where(const(ATAN_F64_MOREBITS), mid.where(const(ATAN_F64_MOREBITS / 2), 0.0))
    return base + core

  @_in_float32
  def atan(self):
    """Arctangent, accurate over the whole line (range reduction as Cephes); atan(+-inf) = +-pi/2."""
    return self._float()._odd(lambda a: a._atan_nonneg())

  @_in_float32
  def asin(self):
    """asin(x) = atan(x / sqrt((1 - x)(1 + x))): (1 - x)(1 + x) is exact enough near |x| = 1; NaN outside [-1, 1]."""
    return self._float()._odd(lambda a: (a / ((1 - a) * (1 + a)).sqrt()).atan())

  @_in_float32
  def acos(self):
    """acos(x) = 2 atan(sqrt((1 - x) / (1 + x))): small results near x = 1 keep their precision (pi/2 - asin(x)
    would cancel); NaN outside [-1, 1]."""
    x = self._float()
    return ((1 - x) / (1 + x)).sqrt().atan() * 2

  # ---------------------------------------------------------------- hyperbolic

  @_in_float32
  def sinh(self):
    """Taylor series for |x| < 1 (no cancellation near 0), (e/2)*e - 1/(2e*e) with e = exp(|x|/2) elsewhere (no
    overflow before the result overflows)."""
    def on_nonneg(a):
      small = a < 1
      s = small.where(a, 0.0)
      e = small.where(1.0, a * 0.5)._exp()
      return small.where(s * _poly(s * s, SINH_SERIES), (e * 0.5) * e - 0.5 / (e * e))
    return self._float()._odd(on_nonneg)

  @_in_float32
  def cosh(self):
    """(e/2)*e + 1/(2e*e) with e = exp(|x|/2): no overflow before the result overflows."""
    e = (self._float().abs() * 0.5)._exp()
    return (e * 0.5) * e + 0.5 / (e * e)

  @_in_float32
  def asinh(self):
    """asinh(|x|) = log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) (accurate near 0), log(|x|) + log(2) beyond 2**28
    (where x^2 would lose the 1, or overflow); odd."""
    def on_nonneg(a):
      big = a > BIG
      s = big.where(0.0, a)
      near = (s + s * s / (1 + (s * s + 1).sqrt())).log1p()
      return big.where(big.where(a, 1.0).log() + LN2, near)
    return self._float()._odd(on_nonneg)

  @_in_float32
  def acosh(self):
    """acosh(x) for x >= 1 (NaN below): log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact) for x < 2,
    log(x + sqrt(x^2 - 1)) up to 2**28, log(x) + log(2) beyond."""
    x = self._float()
    near, big = x < 2, x > BIG
    t = near.where(x, 1.5) - 1
    lo = (t + (t * (t + 2)).sqrt()).log1p()
    m = (near | big).where(2.0, x)
    mid = (m + (m * m - 1).sqrt()).log()
    hi = big.where(x, 2.0).log() + LN2
    out = (x < 1).where(math.nan, near.where(lo, big.where(hi, mid)))
    # torch's derivative 1 / sqrt(x^2 - 1), also where the value is NaN (finite for x < -1)
    return out._with_gradient((x,), lambda o, g, a: (g * (a.detach() * a.detach() - 1).rsqrt(),))

  @_in_float32
  def atanh(self):
    """atanh(|x|) = log1p(2|x| / (1 - |x|)) / 2 (1 - |x| is exact near 1); odd; +-inf at +-1, NaN beyond."""
    return self._float()._odd(lambda a: (2 * a / (1 - a)).log1p() * 0.5)

  # ---------------------------------------------------------------- division

  # div(other, rounding_mode=None | "trunc" | "floor") is Tensor.div in tensor/tensor.py

  # ---------------------------------------------------------------- activations

  @_in_float32
  def quick_gelu(self):
    """x * sigmoid(1.702 x)."""
    x = self._float()
    return x * (x * QUICK_GELU).sigmoid()

  def _elu_negative(self, alpha: float, inner: float = 1.0):
    """alpha * expm1(inner * min(x, 0)): the negative side of elu/celu/selu, never evaluated at large x."""
    return alpha * (self.minimum(0) * inner).expm1()

  @_in_float32
  def elu(self, alpha=1.0):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""
    x = self._float()
    return (x > 0).where(x, x._elu_negative(alpha))

  @_in_float32
  def celu(self, alpha=1.0):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    if alpha == 0: raise ValueError("celu: alpha must not be 0")
    x = self._float()
    return (x > 0).where(x, x._elu_negative(alpha, 1.0 / alpha))

  @_in_float32
  def selu(self):
    """scale * elu(x, alpha) with the constants of Klambauer et al. (2017)."""
    return self._float().elu(SELU_ALPHA) * SELU_SCALE

  @_in_float32
  def mish(self):
    """x * tanh(softplus(x)), as x * n(n+2) / (n(n+2) + 2) with n = exp(x): no cancellation for negative x; the
    factor is 1 (to float64 precision) beyond x = 20."""
    x = self._float()
    n = x.minimum(20)._exp()
    q = n * (n + 2)
    return x * (x > 20).where(1.0, q / (q + 2))

  def swish(self):
    """x * sigmoid(x) (tinygrad's name for silu)."""
    return self.silu()

  @_in_float32
  def hardsigmoid(self):
    """relu6(x + 3) / 6: 0 below -3, 1 above 3."""
    return (self._float() + 3).relu6() / 6

  @_in_float32
  def hardswish(self):
    """torch's definition: 0 for x <= -3, x for x >= 3, x * (x + 3) / 6 between (so -inf gives 0, not -inf * 0)."""
    x = self._float()
    return (x <= -3).where(0.0, (x >= 3).where(x, x * (x + 3) / 6))

  def hardtanh(self, min_val=-1.0, max_val=1.0):
    """x clamped to [min_val, max_val] (NaN stays NaN)."""
    if min_val > max_val: raise ValueError(f"hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
    return self.clip(min_val, max_val)

  def relu6(self):
    """min(max(x, 0), 6)."""
    return self.clip(0, 6)

  @_in_float32
  def logsigmoid(self):
    """log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): no overflow, and tiny -exp(-x) for large x kept."""
    x = self._float()
    return x.minimum(0) - (-x.abs())._exp().log1p()

  def softsign(self):
    """x / (1 + |x|) (torch's formula: +-inf give NaN there too)."""
    x = self._float()
    return x / (x.abs() + 1)

  def softmin(self, dim=-1, dtype=None):
    """softmax(-x) along dim (default the last dim; torch's deprecated implicit dim is not guessed)."""
    x = self.cast(to_dtype(dtype)) if dtype is not None else self
    return (-x).softmax(dim)

  @_in_float32
  def normalize(self, p=2.0, dim=1, eps=1e-12):
    """torch.nn.functional.normalize: x / max(||x||_p, eps) along dim (p: any float, inf, -inf, 0 counts nonzeros)."""
    if self.ndim == 0: raise IndexError("normalize: needs a tensor with at least one dim")
    x = self._float()
    d = _norm_dim(dim, x.ndim, "normalize", x.shape)
    if p == 2: norm = (x * x)._acc_sum(d, keepdim=True).maximum(eps * eps).sqrt()
    elif p == 1: norm = x.abs()._acc_sum(d, keepdim=True)
    elif p == math.inf: norm = x.abs().max(d, keepdim=True)
    elif p == -math.inf: norm = x.abs().min(d, keepdim=True)
    elif p == 0: norm = (x != 0).cast(x.dtype)._acc_sum(d, keepdim=True)
    else: norm = (x.abs() ** p)._acc_sum(d, keepdim=True) ** (1.0 / p)
    return x / norm.maximum(eps)

  # ---------------------------------------------------------------- statistics

  def _dim_or_axis(self, dim, axis, op: str):
    if axis is not None and dim is not None and axis != dim:
      raise ValueError(f"{op}: got dim={dim!r} and axis={axis!r}; give one of them")
    return dim if dim is not None else axis

  def std_mean(self, dim=None, correction=1, keepdim=False, *, axis=None):
    """(std, mean) over dim (torch.std_mean); `axis` is accepted as a synonym of dim."""
    dim = self._dim_or_axis(dim, axis, "std_mean")
    return self.std(dim, keepdim=keepdim, correction=correction), self.mean(dim, keepdim=keepdim)

  def var_mean(self, dim=None, correction=1, keepdim=False, *, axis=None):
    """(var, mean) over dim (torch.var_mean); `axis` is accepted as a synonym of dim."""
    dim = self._dim_or_axis(dim, axis, "var_mean")
    return self.var(dim, keepdim=keepdim, correction=correction), self.mean(dim, keepdim=keepdim)

  # ---------------------------------------------------------------- initializers

  @classmethod
  def normal(cls, *shape, mean=0.0, std=1.0, dtype=None, device=None, requires_grad=None):
    """Samples of N(mean, std^2) (tinygrad's form: shape first)."""
    out = cls.randn(*shape, dtype=dtype, device=device) * std + mean
    if requires_grad: out.requires_grad = True
    return out

  @staticmethod
  def _fan_in(shape, op: str) -> int:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    if len(shape) < 1: raise ValueError(f"{op}: needs a shape with at least one dim")
    return math.prod(shape[1:])

  @classmethod
  def kaiming_uniform(cls, *shape, a=0.01, dtype=None, device=None, requires_grad=None):
    """U(-b, b) with b = sqrt(3) * gain / sqrt(fan_in), gain = sqrt(2 / (1 + a^2)), fan_in = prod(shape[1:])."""
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a * a)) / math.sqrt(cls._fan_in(shape, "kaiming_uniform"))
    out = cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device)
    if requires_grad: out.requires_grad = True
    return out

  @classmethod
  def kaiming_normal(cls, *shape, a=0.01, dtype=None, device=None, requires_grad=None):
    """N(0, std^2) with std = gain / sqrt(fan_in), gain = sqrt(2 / (1 + a^2)), fan_in = prod(shape[1:])."""
    std = math.sqrt(2.0 / (1 + a * a)) / math.sqrt(cls._fan_in(shape, "kaiming_normal"))
    return cls.normal(*shape, mean=0.0, std=std, dtype=dtype, device=device, requires_grad=requires_grad)

  @classmethod
  def scaled_uniform(cls, *shape, dtype=None, device=None, requires_grad=None):
    """U(-1, 1) scaled by 1 / sqrt(numel) (tinygrad's scaled_uniform)."""
    dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    out = cls.uniform(*shape, low=-1.0, high=1.0, dtype=dtype, device=device) * (max(math.prod(dims), 1) ** -0.5)
    if requires_grad: out.requires_grad = True
    return out

  @classmethod
  def glorot_uniform(cls, *shape, dtype=None, device=None, requires_grad=None):
    """U(-b, b) with b = sqrt(6 / (shape[0] + prod(shape[1:]))) (Glorot and Bengio 2010, tinygrad's glorot_uniform)."""
    dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    fan = cls._fan_in(shape, "glorot_uniform") + dims[0]
    bound = math.sqrt(6.0 / fan) if fan > 0 else 0.0
    out = cls.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device)
    if requires_grad: out.requires_grad = True
    return out

  # ---------------------------------------------------------------- copies and casts

  def clone(self):
    """A copy in a buffer of its own, holding self's value as of now: a later assign() into self's buffer does not
    reach it (tinygrad's clone). Lazy: the copy runs with the next realize. Gradients do not flow through it."""
    out = type(self).empty(*self.shape, dtype=self.dtype, device=self.device)
    return out.assign(self) if self.numel() else out

  # named after builtins, so they come last in the class body (which they shadow from here on)
  def half(self): return self.cast(dtypes.float16)
  def bfloat16(self): return self.cast(dtypes.bfloat16)
  def float(self): return self.cast(dtypes.float32)
  def double(self): return self.cast(dtypes.float64)
  def char(self): return self.cast(dtypes.int8)
  def byte(self): return self.cast(dtypes.uint8)
  def short(self): return self.cast(dtypes.int16)
  def int(self): return self.cast(dtypes.int32)
  def long(self): return self.cast(dtypes.int64)
  def bool(self): return self.cast(dtypes.bool)
