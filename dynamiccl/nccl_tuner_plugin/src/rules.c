/* DynamICCL tuner plugin: the config file parser (runs on the reload thread, never on NCCL's).
 *
 * Grammar and validation mirror nccl_tuner_plugin/config.py:parse_configs exactly (tests feed
 * both the same random and malformed files):
 *   - lines separated by '\n'; '#' starts a comment; tokens separated by ASCII blanks
 *     (space, \t, \r, \v, \f);
 *   - `version N` or `version N at T` (N in 1..2^63-1 decimal, T unix ns decimal < 2^63);
 *   - rule: func min max algo proto channels chunk comm (8 tokens), decimal numbers only,
 *     max may be `max`, algo/proto/comm may be `*`, comm is hex with an optional 0x;
 *   - at most DCT_MAX_RULES rules per version, DCT_MAX_VERSIONS versions, strictly increasing.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static const char* const FUNC_NAMES[DCT_NFUNC] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                                  "AllReduce", "AllToAll"};
static const char* const ALGO_NAMES[] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
static const char* const PROTO_NAMES[] = {"LL", "LL128", "SIMPLE"};
#define N_ALGO ((int)(sizeof ALGO_NAMES / sizeof ALGO_NAMES[0]))
#define N_PROTO ((int)(sizeof PROTO_NAMES / sizeof PROTO_NAMES[0]))

int dct_func_index(int f) {
  if (f >= ncclFuncBroadcast && f <= ncclFuncAllReduce) return f;
  if (f == ncclFuncAlltoAll) return 5;
  return -1;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* Decimal digits only, no sign, value <= max. */
static int parse_dec(const char* s, uint64_t max, uint64_t* out) {
  if (*s == '\0') return -1;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return -1;
    uint64_t d = (uint64_t)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  if (v > max) return -1;
  *out = v;
  return 0;
}

/* Optional 0x/0X, then 1..16 hex digits. */
static int parse_hex(const char* s, uint64_t* out) {
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
  size_t n = strlen(s);
  if (n == 0 || n > 16) return -1;
  uint64_t v = 0;
  for (; *s; s++) {
    int d;
    if (*s >= '0' && *s <= '9') d = *s - '0';
    else if (*s >= 'a' && *s <= 'f') d = *s - 'a' + 10;
    else if (*s >= 'A' && *s <= 'F') d = *s - 'A' + 10;
    else return -1;
    v = (v << 4) | (uint64_t)d;
  }
  *out = v;
  return 0;
}

static int name_index(const char* s, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

#define FAIL(...)                             \
  do {                                        \
    snprintf(err, errlen, __VA_ARGS__);       \
    return -1;                                \
  } while (0)

/* Group the rules of one version by function (stable), then build each function's byte-range
   index (see dct_version_t). Runs on the reload thread: quadratic in the rule count is fine. */
static void finish_version(dct_version_t* v, const dct_rule_t* in) {
  uint32_t k = 0;
  for (int f = 0; f < DCT_NFUNC; f++) {
    v->func_start[f] = (uint16_t)k;
    for (uint32_t i = 0; i < v->n_rules; i++)
      if (in[i].func == f) v->rules[k++] = in[i];
  }
  v->func_start[DCT_NFUNC] = (uint16_t)k;
  v->has_comm_rules = 0;
  for (uint32_t i = 0; i < v->n_rules; i++) v->has_comm_rules |= !v->rules[i].any_comm;
  uint32_t nb = 0;
  for (int f = 0; f < DCT_NFUNC; f++) {
    v->bnd_start[f] = (uint16_t)nb;
    uint32_t b0 = nb;
    v->bnd[nb++] = 0;
    for (uint32_t r = v->func_start[f]; r < v->func_start[f + 1]; r++) {
      uint64_t e[2] = {v->rules[r].min_bytes, v->rules[r].max_bytes};
      for (int j = 0; j < 2; j++) {
        uint64_t x = j == 0 ? e[0] : e[1] + 1;
        if (j == 1 && e[1] == UINT64_MAX) continue;
        uint32_t pos = b0; /* insertion into the sorted, duplicate-free run */
        while (pos < nb && v->bnd[pos] < x) pos++;
        if (pos < nb && v->bnd[pos] == x) continue;
        memmove(&v->bnd[pos + 1], &v->bnd[pos], (nb - pos) * sizeof v->bnd[0]);
        v->bnd[pos] = x;
        nb++;
      }
    }
    for (uint32_t i = b0; i < nb; i++) {
      v->first[i] = DCT_NO_RULE;
      for (uint32_t r = v->func_start[f]; r < v->func_start[f + 1]; r++)
        if (v->rules[r].min_bytes <= v->bnd[i] && v->bnd[i] <= v->rules[r].max_bytes) {
          v->first[i] = (uint16_t)r;
          break;
        }
    }
  }
  v->bnd_start[DCT_NFUNC] = (uint16_t)nb;
}

static uint32_t crc32_of(const char* p, size_t n) { /* zlib's CRC-32 (reflected 0xEDB88320) */
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= (uint8_t)p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

/* "# end lines=<1-9 digits> crc32=<8 lowercase hex>\n", exactly (the Python reader's regex). */
static int parse_trailer(const char* p, size_t n, uint32_t* lines, uint32_t* crc) {
  static const char pre[] = "# end lines=", mid[] = " crc32=";
  size_t i = sizeof pre - 1, d = 0;
  if (n < i || memcmp(p, pre, i) != 0) return 0;
  for (*lines = 0; i < n && d < 10 && p[i] >= '0' && p[i] <= '9'; i++, d++) *lines = *lines * 10 + (uint32_t)(p[i] - '0');
  if (d == 0 || d > 9 || n - i < sizeof mid - 1 + 9 || memcmp(p + i, mid, sizeof mid - 1) != 0) return 0;
  i += sizeof mid - 1;
  *crc = 0;
  for (int k = 0; k < 8; k++, i++) {
    char c = p[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return 0;
    *crc = (*crc << 4) | (uint32_t)v;
  }
  return i == n - 1 && p[i] == '\n';
}

/* Format 2: the length of the body before a valid end marker; -1 (reason in err) for a torn file.
   Format 1 (no format-2 header): the whole text. */
static long body_length(const char* text, size_t len, char* err, size_t errlen) {
  size_t hl = sizeof DCT_HEADER_V2 - 1;
  if (len > 0 && len <= hl && memcmp(text, DCT_HEADER_V2, len) == 0) {
    snprintf(err, errlen, "torn file: cut inside the format-2 header");
    return -1;
  }
  int v2 = len > hl && memcmp(text, DCT_HEADER_V2, hl) == 0 && (text[hl] == '\n' || text[hl] == '\r');
  if (!v2) return (long)len;
  size_t cut = len >= 2 ? len - 2 : 0;
  while (cut > 0 && text[cut - 1] != '\n') cut--;
  uint32_t lines = 0, crc = 0;
  if (!parse_trailer(text + cut, len - cut, &lines, &crc)) {
    snprintf(err, errlen, "torn file: no valid '# end lines=K crc32=X' line at the end (format 2)");
    return -1;
  }
  unsigned nl = 0;
  for (size_t i = 0; i < cut; i++) nl += text[i] == '\n';
  if (nl != lines || crc32_of(text, cut) != crc) {
    snprintf(err, errlen, "torn file: the end marker does not match the content (format 2)");
    return -1;
  }
  return (long)cut;
}

int dct_parse(const char* text, size_t len, dct_parsed_t* out, char* err, size_t errlen) {
  static __thread dct_rule_t pending[DCT_MAX_RULES]; /* rules of the current version, file order */
  char line[1024];
  memset(out, 0, sizeof *out);
  if (len > DCT_MAX_FILE_BYTES) FAIL("file is %zu bytes, at most %d", len, DCT_MAX_FILE_BYTES);
  long body = body_length(text, len, err, errlen);
  if (body < 0) return -1;
  len = (size_t)body;
  dct_version_t* cur = NULL;
  size_t pos = 0;
  int lineno = 0;
  while (pos < len) {
    lineno++;
    size_t end = pos;
    while (end < len && text[end] != '\n') end++;
    size_t ll = end - pos;
    /* cut the comment first: a long comment must not make the line "too long" */
    const char* hash = memchr(text + pos, '#', ll);
    if (hash) ll = (size_t)(hash - (text + pos));
    if (memchr(text + pos, '\0', ll)) FAIL("line %d: NUL byte", lineno);
    if (ll >= sizeof line) FAIL("line %d: longer than %zu characters", lineno, sizeof line - 1);
    memcpy(line, text + pos, ll);
    line[ll] = '\0';
    pos = end + 1;
    char* tok[9];
    int nt = 0;
    for (char* p = line; *p;) {
      while (*p && is_blank(*p)) *p++ = '\0';
      if (!*p) break;
      if (nt == 9) {
        nt = 10; /* too many: reported below */
        break;
      }
      tok[nt++] = p;
      while (*p && !is_blank(*p)) p++;
    }
    if (nt == 0) continue;
    if (strcmp(tok[0], "version") == 0) {
      uint64_t ver, at = 0;
      if (!((nt == 2 || (nt == 4 && strcmp(tok[2], "at") == 0)) && parse_dec(tok[1], INT64_MAX, &ver) == 0 &&
            (nt == 2 || parse_dec(tok[3], INT64_MAX, &at) == 0)))
        FAIL("line %d: expected 'version N' or 'version N at T_NS'", lineno);
      if (ver == 0) FAIL("line %d: version must be a positive integer, got 0", lineno);
      if (cur) finish_version(cur, pending);
      if (out->n > 0 && ver <= out->v[out->n - 1].version)
        FAIL("line %d: versions must be strictly increasing (%llu after %llu)", lineno, (unsigned long long)ver,
             (unsigned long long)out->v[out->n - 1].version);
      if (out->n == DCT_MAX_VERSIONS) FAIL("line %d: more than %d versions in one file", lineno, DCT_MAX_VERSIONS);
      cur = &out->v[out->n++];
      cur->version = ver;
      cur->apply_at_ns = at;
      continue;
    }
    if (cur == NULL) FAIL("line %d: rule before the first 'version N' line", lineno);
    if (nt != 8)
      FAIL("line %d: expected 8 fields (func min max algo proto channels chunk comm), got %s%d", lineno,
           nt > 9 ? "more than " : "", nt > 9 ? 9 : nt);
    if (cur->n_rules == DCT_MAX_RULES)
      FAIL("line %d: more than %d rules in version %llu", lineno, DCT_MAX_RULES, (unsigned long long)cur->version);
    dct_rule_t r;
    memset(&r, 0, sizeof r);
    int f = name_index(tok[0], FUNC_NAMES, DCT_NFUNC);
    if (f < 0) FAIL("line %d: unknown collective '%.40s'", lineno, tok[0]);
    r.func = (uint8_t)f;
    if (parse_dec(tok[1], UINT64_MAX, &r.min_bytes) != 0) FAIL("line %d: bad min_bytes '%.40s'", lineno, tok[1]);
    if (strcmp(tok[2], "max") == 0) r.max_bytes = UINT64_MAX;
    else if (parse_dec(tok[2], UINT64_MAX, &r.max_bytes) != 0) FAIL("line %d: bad max_bytes '%.40s'", lineno, tok[2]);
    if (r.min_bytes > r.max_bytes) FAIL("line %d: bad byte range (min > max)", lineno);
    if (strcmp(tok[3], "*") == 0) r.algo = -1;
    else if ((r.algo = (int8_t)name_index(tok[3], ALGO_NAMES, N_ALGO)) < 0)
      FAIL("line %d: unknown algorithm '%.40s'", lineno, tok[3]);
    if (strcmp(tok[4], "*") == 0) r.proto = -1;
    else if ((r.proto = (int8_t)name_index(tok[4], PROTO_NAMES, N_PROTO)) < 0)
      FAIL("line %d: unknown protocol '%.40s'", lineno, tok[4]);
    uint64_t nch;
    if (parse_dec(tok[5], DCT_MAX_CHANNELS, &nch) != 0)
      FAIL("line %d: channel count '%.40s' outside 0..%d", lineno, tok[5], DCT_MAX_CHANNELS);
    r.nch = (uint8_t)nch;
    if (parse_dec(tok[6], UINT64_MAX, &r.chunk) != 0) FAIL("line %d: bad chunk size '%.40s'", lineno, tok[6]);
    if (strcmp(tok[7], "*") == 0) r.any_comm = 1;
    else if (parse_hex(tok[7], &r.comm) != 0) FAIL("line %d: bad communicator hash '%.40s'", lineno, tok[7]);
    pending[cur->n_rules++] = r;
  }
  if (cur) finish_version(cur, pending);
  return 0;
}
