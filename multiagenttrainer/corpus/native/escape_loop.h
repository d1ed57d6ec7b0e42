/* The escaping loop of encode.c, included twice: ESCAPE_FN is the function to define, and
 * ESCAPE_SPREAD (0 or 1) whether it expands blocks of two-byte escapes with SSSE3 byte shuffles
 * (encode.c compiles that one for SSSE3 and calls it only where the CPU has it). */

static int ESCAPE_FN(Sink *sink, const unsigned char *data, Py_ssize_t len, Seen *seen) {
    /* Locals only in the loop: stores through `out` (a char *) may alias anything reachable. */
    Py_ssize_t start = sink->used, used = sink->used, i = 0, line_start = 0;
    Py_ssize_t longest = 0, first_nul = -1, sample_newlines = 0;
    const Py_ssize_t sample = rules.mean_sample;
    if (sink_reserve(sink, len + len / 8 + 64) < 0) return -1;
    Py_ssize_t capacity = PyByteArray_GET_SIZE(sink->array);
    char *out = PyByteArray_AS_STRING(sink->array);
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
#endif
    while (i < len) {
        if (used + 40 > capacity) { /* room for a block escaped by halves, one escape or UTF-8 sequence */
            sink->used = used;
            if (sink_reserve(sink, capacity) < 0) return -1;
            capacity = PyByteArray_GET_SIZE(sink->array);
            out = PyByteArray_AS_STRING(sink->array);
        }
        Py_ssize_t k;
#if defined(__SSE2__)
        if (i + 16 <= len) {
            __m128i v = _mm_loadu_si128((const __m128i *)(data + i));
            _mm_storeu_si128((__m128i *)(out + used), v);
            /* signed compare: bytes >= 0x80 are negative, so `< 0x20` catches them and the controls */
            __m128i hit = _mm_or_si128(_mm_cmplt_epi8(v, space),
                                       _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
            int mask = _mm_movemask_epi8(hit);
            if (!mask) {
                used += 16;
                i += 16;
                continue;
            }
#if ESCAPE_SPREAD
            {
                const __m128i nl = _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'));
                const __m128i controls = _mm_or_si128(
                    _mm_or_si128(nl, _mm_cmpeq_epi8(v, _mm_set1_epi8('\t'))),
                    _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\r')),
                                 _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\b')),
                                              _mm_cmpeq_epi8(v, _mm_set1_epi8('\f')))));
                const __m128i simple = _mm_or_si128(controls, _mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                                                            _mm_cmpeq_epi8(v, backslash)));
                if ((mask & ~_mm_movemask_epi8(simple)) == 0) {
                    /* the letters: n t r b f for the controls, the byte itself otherwise */
                    const __m128i letter_of = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 'b', 't', 'n', 0, 'f', 'r', 0, 0);
                    const __m128i letters = _mm_or_si128(_mm_and_si128(controls, _mm_shuffle_epi8(letter_of, v)),
                                                         _mm_andnot_si128(controls, v));
                    const unsigned lo = (unsigned)mask & 0xff, hi = (unsigned)mask >> 8;
                    __m128i half = _mm_or_si128(_mm_shuffle_epi8(letters, _mm_loadu_si128((const __m128i *)SPREAD[lo])),
                                                _mm_loadu_si128((const __m128i *)SLASHES[lo]));
                    _mm_storeu_si128((__m128i *)(out + used), half);
                    used += SPREAD_LEN[lo];
                    half = _mm_or_si128(_mm_shuffle_epi8(_mm_srli_si128(letters, 8),
                                                         _mm_loadu_si128((const __m128i *)SPREAD[hi])),
                                        _mm_loadu_si128((const __m128i *)SLASHES[hi]));
                    _mm_storeu_si128((__m128i *)(out + used), half);
                    used += SPREAD_LEN[hi];
                    /* the newlines' bookkeeping, one set bit at a time */
                    unsigned lines = (unsigned)_mm_movemask_epi8(nl);
                    if (i < sample) {
                        unsigned in_sample = sample - i >= 16 ? 0xffffu : (1u << (sample - i)) - 1;
                        sample_newlines += __builtin_popcount(lines & in_sample);
                    }
                    while (lines) {
                        Py_ssize_t at = i + __builtin_ctz(lines), line = at - line_start;
                        longest = line > longest ? line : longest;
                        line_start = at + 1;
                        lines &= lines - 1;
                    }
                    i += 16;
                    continue;
                }
            }
#endif
            k = __builtin_ctz((unsigned)mask);
        } else
#endif
        {
            k = 0;
            while (i + k < len && !is_special(data[i + k])) out[used + k] = (char)data[i + k], k++;
            if (i + k == len) {
                used += k;
                break;
            }
        }
        used += k;
        i += k;
        unsigned char c = data[i];
        if (c >= 0x80) {
            Py_ssize_t n = utf8_sequence(data + i, data + len);
            if (n == 0) {
                sink->used = start;
                return 0;
            }
            memcpy(out + used, data + i, (size_t)n);
            used += n;
            i += n;
            continue;
        }
        /* branch-free bookkeeping: newlines are most of the specials in code, mixed with quotes */
        Py_ssize_t is_newline = c == '\n', line = i - line_start;
        longest = (is_newline && line > longest) ? line : longest;
        line_start = is_newline ? i + 1 : line_start;
        sample_newlines += is_newline & (i < sample);
        if (c == 0 && first_nul < 0) first_nul = i;
        memcpy(out + used, ESCAPES[c].text, 8);
        used += ESCAPES[c].len;
        i++;
    }
    if (len - line_start > longest) longest = len - line_start;
    seen->longest_line = longest;
    seen->first_nul = first_nul;
    seen->sample_newlines = sample_newlines;
    sink->used = used;
    return 1;
}


#undef ESCAPE_FN
#undef ESCAPE_SPREAD
