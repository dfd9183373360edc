/* libsme2farm_hide: the SME2-off arm's hiding of SME/SME2 from XNNPACK (see sme2_hide.h).
 *
 * XNNPACK decides once, when it initialises (while the libraries load, before main), whether to
 * use SME/SME2 kernels, from cpuinfo_isa: one struct per process, defined and exported by the
 * wheel's libexecutorch_threadpool and filled once by cpuinfo_initialize(). This library's
 * constructor, with SME2FARM_HIDE_SME2=1, calls cpuinfo_initialize(), checks that the fields it
 * is about to clear agree with the OS's own answer, and clears them; it must therefore run before
 * libexecutorch_backend_xnnpack's constructor:
 *   glibc (Linux, and the Android bundle's own loader) initialises in reverse DT_NEEDED order after
 *     each object's dependencies: this library is the runner's LAST DT_NEEDED;
 *   dyld initialises in load-command order after each image's dependencies: it is FIRST there.
 * The wheel ships no cpuinfo.h, so the layout is carried here (pytorch/cpuinfo include/cpuinfo.h,
 * struct cpuinfo_arm_isa on AArch64: atomics, bf16, sve, sve2, i8mm at bytes 0..4, then the seven
 * SME booleans sme, sme2, sme2p1, sme_i16i32, sme_bi32i32, sme_b16b16, sme_f16f16 at 5..11,
 * uint32 svelen at 12..15, uint32 smelen at 16..19), and checked on every run: where it does not
 * hold, nothing is written and the off arm fails (runner.cpp prints the sentence).
 *
 * C, no C++ runtime, no cpuinfo.h, no libc headers (declared below); the OS's feature query only. */

#include "sme2_hide.h"

#include <stddef.h>
#include <stdint.h>

/* The few libc and OS functions used, declared here instead of through the C library's headers,
 * so this one file also compiles for macOS where no SDK is (tests/test_macos_build.py compiles it
 * with `clang -target arm64-apple-macos14 -ffreestanding` on Linux); the signatures are POSIX's,
 * glibc's and macOS's own. */
char* getenv(const char* name);
void* memset(void* s, int c, size_t n);
void* memcpy(void* dst, const void* src, size_t n);
int snprintf(char* str, size_t size, const char* format, ...);
#if defined(__linux__)
#define AT_HWCAP2 26 /* <elf.h>, <sys/auxv.h> */
unsigned long getauxval(unsigned long type);
#if !defined(__ANDROID__)
unsigned long __getauxval(unsigned long type); /* glibc's own, past the runner's exported getauxval() */
#endif
#endif
#if defined(__APPLE__)
int sysctlbyname(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);
#endif

/* The carried layout. Overridable only to build a library whose layout is wrong on purpose
 * (tests/test_sme2_hide.py proves the failure path with one). */
#ifndef SME2FARM_ISA_SME_OFFSET
#define SME2FARM_ISA_SME_OFFSET 5
#endif
#ifndef SME2FARM_ISA_SMELEN_OFFSET
#define SME2FARM_ISA_SMELEN_OFFSET 16
#endif
#define SME2FARM_ISA_SME_FIELDS 7 /* sme .. sme_f16f16 */
#define SME2FARM_ISA_BYTES 31     /* sizeof(struct cpuinfo_arm_isa) on AArch64 without padding */

#define HWCAP2_SME_BIT 23
#define HWCAP2_SME2_BIT 37

#define EXPORT __attribute__((visibility("default")))

/* Declared as bytes: the layout above is how they are read. */
extern unsigned char cpuinfo_isa[];
extern _Bool cpuinfo_initialize(void);

static struct sme2farm_hide_report report;
static volatile int checking;

static unsigned read_u32(int offset) {
  uint32_t v;
  memcpy(&v, cpuinfo_isa + offset, sizeof v);
  return v;
}

static void read_view(int* sme, int* sme2, unsigned* smelen) {
  *sme = cpuinfo_isa[SME2FARM_ISA_SME_OFFSET];
  *sme2 = cpuinfo_isa[SME2FARM_ISA_SME_OFFSET + 1];
  *smelen = read_u32(SME2FARM_ISA_SMELEN_OFFSET);
}

/* The OS's answer, asked directly (never through the runner's exported getauxval()). */
static void os_answer(int* sme, int* sme2) {
  *sme = *sme2 = 0;
#if defined(__linux__) && !defined(__ANDROID__)
  unsigned long hwcap2 = __getauxval(AT_HWCAP2);
  *sme = (int)((hwcap2 >> HWCAP2_SME_BIT) & 1);
  *sme2 = (int)((hwcap2 >> HWCAP2_SME2_BIT) & 1);
  snprintf(report.os_source, sizeof report.os_source, "getauxval(AT_HWCAP2)");
#elif defined(__linux__)
  unsigned long hwcap2 = getauxval(AT_HWCAP2);
  *sme = (int)((hwcap2 >> HWCAP2_SME_BIT) & 1);
  *sme2 = (int)((hwcap2 >> HWCAP2_SME2_BIT) & 1);
  snprintf(report.os_source, sizeof report.os_source, "getauxval(AT_HWCAP2)");
#elif defined(__APPLE__)
  int v = 0;
  size_t len = sizeof v;
  if (sysctlbyname("hw.optional.arm.FEAT_SME", &v, &len, NULL, 0) == 0) *sme = v != 0;
  v = 0;
  len = sizeof v;
  if (sysctlbyname("hw.optional.arm.FEAT_SME2", &v, &len, NULL, 0) == 0) *sme2 = v != 0;
  snprintf(report.os_source, sizeof report.os_source, "sysctlbyname(hw.optional.arm.FEAT_SME, FEAT_SME2)");
#endif
}

/* NULL when the SME fields of cpuinfo_isa, as cpuinfo filled them, agree with the OS; else the
 * disagreement, written into report.detail. */
static const char* check_layout(void) {
  char* d = report.detail;
  size_t n = sizeof report.detail;
  for (int i = 0; i < SME2FARM_ISA_SME_FIELDS; i++) {
    unsigned char b = cpuinfo_isa[SME2FARM_ISA_SME_OFFSET + i];
    if (b > 1) {
      snprintf(d, n, "byte %d of cpuinfo_isa, where this build expects an SME flag, reads %u, not a bool "
               "(this cpuinfo lays its struct out differently)", SME2FARM_ISA_SME_OFFSET + i, b);
      return d;
    }
  }
  unsigned smelen = report.read_smelen;
  if (report.os_sme) {
    if (!report.read_sme) {
      snprintf(d, n, "the OS reports SME through %s but cpuinfo_isa reads SME 0 at byte %d (this cpuinfo "
               "lays its struct out differently)", report.os_source, SME2FARM_ISA_SME_OFFSET);
      return d;
    }
    if (smelen < 16 || smelen > 256 || (smelen & (smelen - 1)) != 0) {
      snprintf(d, n, "the OS reports SME but cpuinfo_isa's SME length at byte %d reads %u, not a vector "
               "length in bytes (this cpuinfo lays its struct out differently)", SME2FARM_ISA_SMELEN_OFFSET, smelen);
      return d;
    }
  } else {
    for (int i = 0; i < SME2FARM_ISA_SME_FIELDS; i++) {
      if (cpuinfo_isa[SME2FARM_ISA_SME_OFFSET + i]) {
        snprintf(d, n, "the OS reports no SME through %s but cpuinfo_isa byte %d reads 1 (this cpuinfo lays "
                 "its struct out differently)", report.os_source, SME2FARM_ISA_SME_OFFSET + i);
        return d;
      }
    }
    if (smelen != 0) {
      snprintf(d, n, "the OS reports no SME but cpuinfo_isa's SME length at byte %d reads %u (this cpuinfo "
               "lays its struct out differently)", SME2FARM_ISA_SMELEN_OFFSET, smelen);
      return d;
    }
  }
  if (report.os_sme2 != report.read_sme2) {
    snprintf(d, n, "the OS reports SME2 %d through %s but cpuinfo_isa reads SME2 %d at byte %d (this cpuinfo "
             "lays its struct out differently)", report.os_sme2, report.os_source, report.read_sme2,
             SME2FARM_ISA_SME_OFFSET + 1);
    return d;
  }
  return NULL;
}

static int isa_untouched(void) {
  for (int i = 0; i < SME2FARM_ISA_BYTES; i++)
    if (cpuinfo_isa[i]) return 0;
  return 1;
}

static void fill_shown(void) {
  read_view(&report.shown_sme, &report.shown_sme2, &report.shown_smelen);
}

__attribute__((constructor)) static void sme2farm_hide_at_load(void) {
  const char* hide = getenv("SME2FARM_HIDE_SME2");
  if (hide == NULL || hide[0] != '1') return; /* the on arm: checked later, on request, untouched */
  os_answer(&report.os_sme, &report.os_sme2);
  /* cpuinfo_isa is zero until cpuinfo_initialize() has filled it (every arm64 CPU has some flag:
   * crc32, aes, atomics...). Already filled means someone initialised cpuinfo before this
   * constructor ran, and XNNPACK may already have read it. */
  int first = isa_untouched();
  checking = 1;
  _Bool ok = cpuinfo_initialize();
  checking = 0;
  read_view(&report.read_sme, &report.read_sme2, &report.read_smelen);
  if (!ok) {
    report.status = SME2FARM_HIDE_FAILED;
    snprintf(report.detail, sizeof report.detail, "cpuinfo_initialize() failed, so cpuinfo_isa cannot be checked");
    fill_shown();
    return;
  }
  if (!first) {
#if defined(__linux__)
    /* cpuinfo asked the runner's getauxval(), which hid SME/SME2 then (this library was not yet
     * checking): what cpuinfo holds is that hidden view. Nothing to clear, nothing to check the
     * layout against; what XNNPACK read must still be clear. */
    if (!report.read_sme && !report.read_sme2) {
      report.status = SME2FARM_HIDE_BY_GETAUXVAL;
      snprintf(report.detail, sizeof report.detail, "cpuinfo was initialised before libsme2farm_hide ran, "
               "so its layout could not be checked; its view of HWCAP2 came through the runner's getauxval()");
      fill_shown();
      return;
    }
#endif
    report.status = SME2FARM_HIDE_FAILED;
    snprintf(report.detail, sizeof report.detail, "cpuinfo was initialised before libsme2farm_hide ran (it must "
             "initialise before libexecutorch_backend_xnnpack), so XNNPACK may already have read SME %d SME2 %d",
             report.read_sme, report.read_sme2);
    fill_shown();
    return;
  }
  if (check_layout() != NULL) {
    report.status = SME2FARM_HIDE_FAILED; /* nothing written: the layout is not the one carried here */
    fill_shown();
    return;
  }
  report.layout_ok = 1;
  if (!report.os_sme && !report.os_sme2) {
    report.status = SME2FARM_HIDE_NOTHING;
  } else {
    memset(cpuinfo_isa + SME2FARM_ISA_SME_OFFSET, 0, SME2FARM_ISA_SME_FIELDS);
    memset(cpuinfo_isa + SME2FARM_ISA_SMELEN_OFFSET, 0, 4);
    report.status = SME2FARM_HIDE_HIDDEN;
  }
  fill_shown();
}

EXPORT const struct sme2farm_hide_report* sme2farm_hide_report(void) {
  if (report.status == SME2FARM_HIDE_NOT_ASKED && !report.os_source[0]) {
    /* The on arm: XNNPACK has initialised cpuinfo by now (this call is idempotent); check what it
     * read against the OS, touching nothing. */
    os_answer(&report.os_sme, &report.os_sme2);
    if (cpuinfo_initialize()) {
      read_view(&report.read_sme, &report.read_sme2, &report.read_smelen);
      report.layout_ok = check_layout() == NULL;
    } else {
      snprintf(report.detail, sizeof report.detail, "cpuinfo_initialize() failed");
    }
    fill_shown();
  }
  return &report;
}

EXPORT int sme2farm_hide_checking(void) { return checking; }
