/* safetensors.c - read and write the weights file of a model directory.
 *
 * Layout (huggingface/safetensors): an 8-byte little-endian header length N,
 * N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [b, e]}, ...}
 * with an optional "__metadata__" entry, then the data section; offsets are
 * relative to its start. The reader reads the header first and checks every
 * entry, and that the tensors cover the data section exactly (the format
 * has no holes: a byte no tensor covers, trailing bytes included, is
 * refused naming its offset), before it reads the data: so it reads, and
 * holds, only what the model keeps, and a model is either entirely valid or
 * not loaded. The data is read into memory of its own. It does not map the file: with a
 * mapping, copying other weights over the file changed a running daemon's
 * answers and truncating it killed the daemon with SIGBUS. The SHA-256 of
 * those bytes (Nettle) names the weights a model serves; it is
 * computed on first use (cn_safetensors_sha256), since `canopy run` never
 * asks for it. Only F32 is accepted, and the host must be little endian (the
 * data is used in place). */
#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "input/input.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c uses little-endian float data in place"
#endif

#define MAX_HEADER (100u * 1024 * 1024)

typedef struct span {
  int64_t begin, end;
  int idx;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Checks one header entry and fills t but its data pointer (the data is
 * not read yet). data_at is the data section's offset in the file,
 * data_len its length; the file is read to a 64-byte aligned buffer. */
static int parse_entry(const char *path, const char *name, json_t *e,
                       int64_t data_at, int64_t data_len, cn_tensor *t,
                       span *sp, cn_err *err) {
  int rc = CN_E_BAD_MODEL;
  if (strlen(name) >= sizeof(t->name)) {
    cn_err_set(err, rc, "%s: tensor name '%.40s...' is longer than %zu bytes",
               path, name, sizeof(t->name) - 1);
    goto out;
  }
  if (!json_is_object(e)) {
    cn_err_set(err, rc, "%s: tensor '%s': header entry is not an object",
               path, name);
    goto out;
  }
  const char *dtype = json_string_value(json_object_get(e, "dtype"));
  if (dtype == NULL) {
    cn_err_set(err, rc, "%s: tensor '%s': no \"dtype\" string", path, name);
    goto out;
  }
  if (strcmp(dtype, "F32") != 0) {
    cn_err_set(err, rc, "%s: tensor '%s' has dtype %s; only F32 is "
               "supported (convert the weights to float32)", path, name,
               dtype);
    goto out;
  }
  json_t *shape = json_object_get(e, "shape");
  if (!json_is_array(shape) || json_array_size(shape) > 4) {
    cn_err_set(err, rc, "%s: tensor '%s': \"shape\" must be an array of at "
               "most 4 integers", path, name);
    goto out;
  }
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->ndim = (int)json_array_size(shape);
  t->numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    json_t *v = json_array_get(shape, (size_t)d);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
      cn_err_set(err, rc, "%s: tensor '%s': shape[%d] is not a "
                 "non-negative integer", path, name, d);
      goto out;
    }
    int64_t s = json_integer_value(v);
    t->shape[d] = s;
    if (s > 0 && t->numel > INT64_MAX / 4 / s) {
      cn_err_set(err, rc, "%s: tensor '%s': shape is too large", path, name);
      goto out;
    }
    t->numel *= s;
  }
  json_t *offs = json_object_get(e, "data_offsets");
  json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      !json_is_integer(b) || !json_is_integer(en) ||
      json_integer_value(b) < 0 || json_integer_value(en) < 0) {
    cn_err_set(err, rc, "%s: tensor '%s': \"data_offsets\" must be [begin, "
               "end] with non-negative integers", path, name);
    goto out;
  }
  int64_t begin = json_integer_value(b), end = json_integer_value(en);
  if (begin > end || end > data_len) {
    cn_err_set(err, rc, "%s: tensor '%s': data_offsets [%lld, %lld] are not "
               "inside the data section of %lld bytes (file cut short?)",
               path, name, (long long)begin, (long long)end,
               (long long)data_len);
    goto out;
  }
  if (end - begin != t->numel * 4) {
    cn_err_set(err, rc, "%s: tensor '%s': data_offsets span %lld bytes but "
               "its shape holds %lld F32 values (%lld bytes)", path, name,
               (long long)(end - begin), (long long)t->numel,
               (long long)t->numel * 4);
    goto out;
  }
  if (t->numel > 0 && ((data_at + begin) & 3) != 0) {
    cn_err_set(err, rc, "%s: tensor '%s' starts at file byte %lld, which is "
               "not 4-byte aligned; rewrite the file with its header padded "
               "to a multiple of 8 bytes", path, name,
               (long long)(data_at + begin));
    goto out;
  }
  t->data = NULL;
  sp->begin = begin;
  sp->end = end;
  rc = 0;
out:
  return rc;
}

void cn_safetensors_close(cn_safetensors *st) {
  if (st == NULL) return;
  free(st->bytes);
  free(st->tensors);
  memset(st, 0, sizeof(*st));
}

/* Reads n bytes of fd into buf; a short file is an error (it shrank while
 * being read). */
static int read_whole(int fd, char *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, buf + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return k == 0 ? EIO : errno;
    got += (size_t)k;
  }
  return 0;
}

static void sha256_hex(const void *p, size_t n, char out[65]) {
  static const char hex[] = "0123456789abcdef";
  struct sha256_ctx c;
  uint8_t md[SHA256_DIGEST_SIZE];
  sha256_init(&c);
  sha256_update(&c, n, p);
  sha256_digest(&c, sizeof(md), md);
  for (int i = 0; i < SHA256_DIGEST_SIZE; i++) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  out[64] = '\0';
}

const char *cn_safetensors_sha256(cn_safetensors *st) {
  int s = 0;
  if (atomic_compare_exchange_strong(&st->sha256_state, &s, 1)) {
    sha256_hex(st->bytes, st->n_bytes, st->sha256);
    atomic_store(&st->sha256_state, 2);
  } else {
    while (atomic_load(&st->sha256_state) != 2) sched_yield();
  }
  return st->sha256;
}

/* Reads path into memory and checks its whole header (see the file
 * comment). On failure st is left empty (safe to close) and err names the
 * file and tensor. */
int cn_safetensors_open(const char *path, cn_safetensors *st, cn_err *err) {
  return cn_safetensors_open_at(AT_FDCWD, path, path, st, err);
}

int cn_safetensors_open_at(int dirfd, const char *rel, const char *path,
                           cn_safetensors *st, cn_err *err) {
  int rc = CN_E_BAD_MODEL;
  int fd = -1;
  json_t *hdr = NULL;
  span *spans = NULL;
  char *text = NULL;
  memset(st, 0, sizeof(*st));
  uint64_t fsize;
  if ((rc = cn__open_regular_at(dirfd, rel, path, INT64_MAX, &fd, &fsize,
                                err)) != 0)
    goto out;
  rc = CN_E_BAD_MODEL;
  if (fsize < 8) {
    cn_err_set(err, rc, "%s: %lld bytes is too short for a safetensors file "
               "(8-byte header length, header, data)", path,
               (long long)fsize);
    goto out;
  }
  unsigned char lenb[8];
  int rerr = read_whole(fd, (char *)lenb, 8);
  if (rerr != 0) {
    rc = cn_err_set(err, CN_E_IO, "%s: cannot read its first 8 bytes: %s",
                    path, rerr == EIO ? "the file shrank while being read"
                                      : strerror(rerr));
    goto out;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenb[i];
  if (hlen > fsize - 8 || hlen > MAX_HEADER) {
    cn_err_set(err, rc, "%s: header length %llu does not fit in the file "
               "(%lld bytes) or exceeds %u bytes", path,
               (unsigned long long)hlen, (long long)fsize, MAX_HEADER);
    goto out;
  }
  text = malloc((size_t)hlen + 1);
  if (text == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "%s: no memory for a header of %llu "
                    "bytes", path, (unsigned long long)hlen);
    goto out;
  }
  if ((rerr = read_whole(fd, text, (size_t)hlen)) != 0) {
    rc = cn_err_set(err, CN_E_IO, "%s: cannot read its header of %llu "
                    "bytes: %s", path, (unsigned long long)hlen,
                    rerr == EIO ? "the file shrank while being read"
                                : strerror(rerr));
    goto out;
  }
  json_error_t je;
  hdr = json_loadb(text, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
  if (hdr == NULL || !json_is_object(hdr)) {
    cn_err_set(err, rc, "%s: the header is not a JSON object: %s", path,
               hdr == NULL ? je.text : "wrong JSON type");
    goto out;
  }
  size_t n = json_object_size(hdr);
  st->tensors = cn__xcalloc(n, sizeof(*st->tensors));
  spans = cn__xcalloc(n, sizeof(*spans));
  if (st->tensors == NULL || spans == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "%s: out of memory", path);
    goto out;
  }
  const int64_t data_at = (int64_t)(8 + hlen);
  const int64_t data_len = (int64_t)(fsize - 8 - hlen);
  const char *name;
  json_t *e;
  int k = 0;
  json_object_foreach(hdr, name, e) {
    if (strcmp(name, "__metadata__") == 0) continue;
    if (parse_entry(path, name, e, data_at, data_len, &st->tensors[k],
                    &spans[k], err) != 0)
      goto out;
    spans[k].idx = k;
    k++;
  }
  /* Overlaps and holes: the sorted byte spans (empty tensors occupy
   * nothing) must tile the data section from its first byte to the
   * file's last; anything else is refused before the data is read. */
  qsort(spans, (size_t)k, sizeof(*spans), span_cmp);
  int64_t last_end = 0;
  int last = -1;
  for (int i = 0; i < k; i++) {
    if (spans[i].begin == spans[i].end) continue;
    if (last >= 0 && spans[i].begin < last_end) {
      cn_err_set(err, rc, "%s: tensors '%s' and '%s' overlap in the data "
                 "section", path, st->tensors[last].name,
                 st->tensors[spans[i].idx].name);
      goto out;
    }
    if (spans[i].begin > last_end) {
      cn_err_set(err, rc, "%s: bytes %lld to %lld of the file lie between "
                 "tensors, in none of them (before '%s'); a safetensors "
                 "file has no holes", path, (long long)(data_at + last_end),
                 (long long)(data_at + spans[i].begin - 1),
                 st->tensors[spans[i].idx].name);
      goto out;
    }
    last_end = spans[i].end;
    last = spans[i].idx;
  }
  if (last_end < data_len) {
    cn_err_set(err, rc, "%s: bytes %lld to %lld of the file (%lld bytes) "
               "belong to no tensor; a safetensors file has no holes and "
               "ends with its last tensor (trailing bytes are refused, not "
               "read)", path, (long long)(data_at + last_end),
               (long long)fsize - 1, (long long)(data_len - last_end));
    goto out;
  }
  /* the header is valid and covers every byte: now the data */
  st->n_bytes = (size_t)fsize;
  if (posix_memalign(&st->bytes, 64, st->n_bytes) != 0) {
    st->bytes = NULL;
    rc = cn_err_set(err, CN_E_NOMEM, "%s: no memory for %zu bytes", path,
                    st->n_bytes);
    goto out;
  }
  memcpy(st->bytes, lenb, 8);
  memcpy((char *)st->bytes + 8, text, (size_t)hlen);
  rerr = read_whole(fd, (char *)st->bytes + data_at, (size_t)data_len);
  if (rerr != 0) {
    rc = cn_err_set(err, CN_E_IO, "%s: cannot read %zu bytes: %s", path,
                    st->n_bytes, rerr == EIO ? "the file shrank while being "
                    "read" : strerror(rerr));
    goto out;
  }
  for (int i = 0; i < k; i++)
    st->tensors[spans[i].idx].data =
        (const float *)((const char *)st->bytes + data_at + spans[i].begin);
  st->n = k;
  rc = 0;
out:
  if (rc != 0) cn_safetensors_close(st);
  if (fd >= 0) close(fd);
  json_decref(hdr);
  free(text);
  free(spans);
  return rc;
}

const cn_tensor *cn_safetensors_find(const cn_safetensors *st,
                                     const char *name) {
  for (int i = 0; st != NULL && i < st->n; i++)
    if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
  return NULL;
}

static int write_all(FILE *f, const void *p, size_t n) {
  return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

/* What cn_safetensors_write puts in its file, for fill_tensors. */
typedef struct {
  const unsigned char *lenb;
  const char *text;
  size_t hlen, pad;
  const cn_tensor_out *t;
  int n;
} st_fill;

/* The length, the header padded with spaces, then each tensor's data. */
static int fill_tensors(FILE *f, void *ctx) {
  const st_fill *s = ctx;
  int bad = write_all(f, s->lenb, 8) || write_all(f, s->text, s->hlen);
  for (size_t i = 0; i < s->pad && !bad; i++) bad = fputc(' ', f) == EOF;
  for (int i = 0; i < s->n && !bad; i++) {
    int64_t numel = 1;
    for (int d = 0; d < s->t[i].ndim; d++) numel *= s->t[i].shape[d];
    bad = write_all(f, s->t[i].data, (size_t)numel * 4);
  }
  return bad ? -1 : 0;
}

/* Writes tensors in the order given, their data back to back. The header is
 * padded with spaces so the data section starts at a multiple of 8, which
 * keeps every F32 tensor aligned when mapped. path.tmp is renamed over
 * path only once complete and synced. */
int cn_safetensors_write(const char *path, const cn_tensor_out *t, int n,
                         cn_err *err) {
  int rc = CN_E_INTERNAL;
  json_t *hdr = json_object();
  char *text = NULL, *tmp = NULL;
  int64_t off = 0;
  for (int i = 0; i < n && hdr != NULL; i++) {
    int64_t numel = 1;
    if (json_object_get(hdr, t[i].name) != NULL) {
      cn_err_set(err, rc, "%s: tensor '%s' is listed twice", path, t[i].name);
      goto out;
    }
    json_t *shape = json_array(), *e = json_object(), *offs = json_array();
    if (shape == NULL || e == NULL || offs == NULL ||
        json_object_set_new(hdr, t[i].name, e) != 0) {
      json_decref(shape);
      json_decref(offs);
      rc = cn_err_set(err, CN_E_NOMEM, "%s: out of memory", path);
      goto out;
    }
    json_object_set_new(e, "dtype", json_string("F32"));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", offs);
    if (t[i].ndim < 0 || t[i].ndim > 4) {
      cn_err_set(err, rc, "%s: tensor '%s' has %d dimensions (at most 4)",
                 path, t[i].name, t[i].ndim);
      goto out;
    }
    for (int d = 0; d < t[i].ndim; d++) {
      if (t[i].shape[d] < 0) {
        cn_err_set(err, rc, "%s: tensor '%s' has a negative dimension", path,
                   t[i].name);
        goto out;
      }
      json_array_append_new(shape, json_integer(t[i].shape[d]));
      numel *= t[i].shape[d];
    }
    json_array_append_new(offs, json_integer(off));
    json_array_append_new(offs, json_integer(off + numel * 4));
    off += numel * 4;
  }
  if (hdr != NULL) text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
  size_t pl = strlen(path);
  tmp = malloc(pl + 5);
  if (text == NULL || tmp == NULL) {
    rc = cn_err_set(err, CN_E_NOMEM, "%s: out of memory", path);
    goto out;
  }
  memcpy(tmp, path, pl);
  memcpy(tmp + pl, ".tmp", 5);
  size_t hlen = strlen(text), pad = (8 - (8 + hlen) % 8) % 8;
  unsigned char lenb[8];
  for (int i = 0; i < 8; i++)
    lenb[i] = (unsigned char)((hlen + pad) >> (8 * i));
  st_fill fill = {lenb, text, hlen, pad, t, n};
  rc = cn__file_write_atomic_err(path, tmp, false, fill_tensors, &fill, err);
out:
  json_decref(hdr);
  free(text);
  free(tmp);
  return rc;
}
