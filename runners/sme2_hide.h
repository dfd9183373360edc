/* libsme2farm_hide: hides SME/SME2 from XNNPACK for the SME2-off arm through the process's one
 * cpuinfo state (cpuinfo_isa in the wheel's libexecutorch_threadpool), switched by
 * SME2FARM_HIDE_SME2=1, so one runner binary serves both arms on Linux, Android and macOS.
 * runners/sme2_hide.c does the work in a constructor that must run before
 * libexecutorch_backend_xnnpack's (the link order in runners/CMakeLists.txt sees to it);
 * runners/runner.cpp reads the result through sme2farm_hide_report() and prints it, or fails the
 * off arm when SME2 could not be hidden. docs/design.md, "One runner binary, both arms". */
#ifndef SME2FARM_HIDE_H
#define SME2FARM_HIDE_H

#ifdef __cplusplus
extern "C" {
#endif

enum sme2farm_hide_status {
  SME2FARM_HIDE_NOT_ASKED = 0,    /* SME2FARM_HIDE_SME2 unset: the SME2-on arm, nothing touched */
  SME2FARM_HIDE_HIDDEN = 1,       /* checked against the OS, then cleared before XNNPACK initialised */
  SME2FARM_HIDE_NOTHING = 2,      /* checked: the CPU has no SME, so there was nothing to hide */
  SME2FARM_HIDE_BY_GETAUXVAL = 3, /* cpuinfo initialised before this library (Linux): its view of
                                     HWCAP2 came through the runner's getauxval(), which hid SME */
  SME2FARM_HIDE_FAILED = -1       /* SME2 cannot be hidden in this build: `detail` says why */
};

struct sme2farm_hide_report {
  int status;                /* enum sme2farm_hide_status */
  int layout_ok;             /* cpuinfo_isa's SME fields agree with the OS (the check passed) */
  int os_sme, os_sme2;       /* the OS's own answer: getauxval(AT_HWCAP2) or sysctlbyname */
  int read_sme, read_sme2;   /* cpuinfo_isa's sme / sme2 as cpuinfo filled them (before clearing) */
  unsigned read_smelen;      /* cpuinfo_isa.smelen as filled */
  int shown_sme, shown_sme2; /* cpuinfo_isa's sme / sme2 now: what XNNPACK reads */
  unsigned shown_smelen;
  char os_source[64];        /* "getauxval(AT_HWCAP2)" or "sysctlbyname(hw.optional.arm.FEAT_SME*)" */
  char detail[320];          /* why it failed (status FAILED), or why the check did not pass */
};

/* The result of the constructor's work. In the on arm (nothing asked) the check runs now, without
 * clearing anything, so the log can say what XNNPACK was shown there too. Never NULL. */
const struct sme2farm_hide_report* sme2farm_hide_report(void);

/* 1 while the constructor lets cpuinfo read the real HWCAP2 (the runner's exported getauxval()
 * passes it through then), else 0. Linux and Android only; always 0 elsewhere. */
int sme2farm_hide_checking(void);

#ifdef __cplusplus
}
#endif

#endif
