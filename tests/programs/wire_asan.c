/* wire_asan.c -- the wire codec's C half under AddressSanitizer and UBSan.
 *
 * Built and run by tests/unit/test_wire_native.py (test_the_c_half_under_asan): reads
 * datagrams from stdin (u32 little-endian length, then the bytes), copies each into a
 * heap block of exactly its size -- so a read one byte past its end is an ASan error,
 * which a Python bytes object (padded, NUL-terminated) would hide -- and runs it
 * through llft_wire_open as a datagram, through llft_wire_parse as a bare payload, and
 * sealed with the cluster key then opened (so the payload checks behind the tag are
 * reached too). Prints how many of each verdict it saw; any sanitizer report fails. */
#include "llft_wire.c"

#include <stdio.h>

int main(void) {
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)i;
    llft_wire *w = llft_wire_new(key, sizeof key);
    if (w == NULL) return 2;
    llft_wire_support(w, 1);
    const uint8_t masks[3] = {LLFT_WIRE_INT, LLFT_WIRE_BYTES, LLFT_WIRE_INT};
    llft_wire_schema(w, 1, 1, 3, "offset\0data\0flags\0", masks);         /* REQUEST */
    llft_wire_schema(w, 2, 1, 3, "offset\0data\0flags\0", masks);         /* REPLY */
    llft_wire_schema(w, 3, 0, 0, "", masks);                              /* FIRST_ACK */
    const uint8_t ints[5] = {1, 1, 1, 1, 1};
    llft_wire_schema(w, 7, 0, 5, "rank\0served\0lineage\0change\0wait\0", ints);
    llft_wire_schema(w, 8, 0, 2, "upto\0done\0", ints);                  /* ORDER_INFO */
    const uint8_t list[1] = {LLFT_WIRE_LIST};
    llft_wire_schema(w, 6, 0, 1, "missing\0", list);                     /* NACK */
    unsigned long verdicts[LLFT_WIRE_REJECT + 16] = {0};
    uint64_t out[LLFT_WIRE_OUT];
    uint32_t n;
    unsigned long count = 0;
    while (fread(&n, sizeof n, 1, stdin) == 1) {
        if (n > (1u << 21)) return 3;
        char *dg = malloc(n ? n : 1);
        char *sealed = malloc(20 + (size_t)n);
        if (dg == NULL || sealed == NULL || fread(dg, 1, n, stdin) != n) return 4;
        memset(out, 0, sizeof out);
        llft_wire_open(w, dg, n, 1 << 20, out);
        verdicts[out[0] < LLFT_WIRE_REJECT + 16 ? out[0] : 0]++;
        llft_wire_parse(w, dg, n, 1 << 20, out);
        verdicts[out[0] < LLFT_WIRE_REJECT + 16 ? out[0] : 0]++;
        if (n <= 65487) {
            size_t m = llft_wire_seal(w, 1, 0, dg, n, sealed);
            llft_wire_open(w, sealed, m, 1 << 20, out);
            verdicts[out[0] < LLFT_WIRE_REJECT + 16 ? out[0] : 0]++;
        }
        free(dg);
        free(sealed);
        count++;
    }
    printf("inputs %lu ok %lu fallback %lu fragment %lu", count, verdicts[LLFT_WIRE_OK],
           verdicts[LLFT_WIRE_FALLBACK], verdicts[LLFT_WIRE_FRAGMENT]);
    for (int r = 0; r < 16; r++)
        if (verdicts[LLFT_WIRE_REJECT + r]) printf(" r%d %lu", r, verdicts[LLFT_WIRE_REJECT + r]);
    printf("\n");
    llft_wire_free(w);
    return 0;
}
