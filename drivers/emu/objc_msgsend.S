/* objc_msgSend and objc_msgSend_stret for GCC's GNU Objective-C runtime (libobjc4), x86-64 System V.

   The GNU runtime dispatches with objc_msg_lookup(receiver, selector) -> IMP and exports no objc_msgSend. Apple's
   runtimes export objc_msgSend, which code casts to each method's exact prototype (as drivers/metal/objc.py does).
   These trampolines give the GNU runtime that entry point: save every register that can carry an argument (rdi,
   rsi, rdx, rcx, r8, r9; rax = the number of vector registers a variadic call uses; xmm0-7), look the IMP up, restore
   them and jump to it with the caller's stack untouched, so arguments passed in memory (a 24-byte MTLSize by value)
   are where the IMP expects them. A struct return larger than 16 bytes goes through a hidden pointer in rdi
   (System V AMD64 ABI 3.2.3): the receiver and selector are then in rsi and rdx, the case objc_msgSend_stret is for
   (Apple's objc/message.h: "struct-returning Messaging Primitives", x86-64 only; arm64 has no _stret).
   Built with the system compiler and cached on disk (drivers/emu/objc_runtime.py). */

        .text

        .macro SAVE_ARGUMENTS
        pushq   %rbp
        movq    %rsp, %rbp
        subq    $192, %rsp              /* 7 GPRs (+8 padding) and 8 xmm registers; rsp stays 16-byte aligned */
        movq    %rdi, 0(%rsp)
        movq    %rsi, 8(%rsp)
        movq    %rdx, 16(%rsp)
        movq    %rcx, 24(%rsp)
        movq    %r8, 32(%rsp)
        movq    %r9, 40(%rsp)
        movq    %rax, 48(%rsp)
        movdqa  %xmm0, 64(%rsp)
        movdqa  %xmm1, 80(%rsp)
        movdqa  %xmm2, 96(%rsp)
        movdqa  %xmm3, 112(%rsp)
        movdqa  %xmm4, 128(%rsp)
        movdqa  %xmm5, 144(%rsp)
        movdqa  %xmm6, 160(%rsp)
        movdqa  %xmm7, 176(%rsp)
        .endm

        .macro RESTORE_AND_JUMP
        movq    %rax, %r11              /* the IMP */
        movq    0(%rsp), %rdi
        movq    8(%rsp), %rsi
        movq    16(%rsp), %rdx
        movq    24(%rsp), %rcx
        movq    32(%rsp), %r8
        movq    40(%rsp), %r9
        movq    48(%rsp), %rax
        movdqa  64(%rsp), %xmm0
        movdqa  80(%rsp), %xmm1
        movdqa  96(%rsp), %xmm2
        movdqa  112(%rsp), %xmm3
        movdqa  128(%rsp), %xmm4
        movdqa  144(%rsp), %xmm5
        movdqa  160(%rsp), %xmm6
        movdqa  176(%rsp), %xmm7
        leave
        jmp     *%r11
        .endm

        .globl  objc_msgSend
        .type   objc_msgSend, @function
objc_msgSend:
        SAVE_ARGUMENTS
        call    objc_msg_lookup@PLT     /* (rdi receiver, rsi selector) */
        RESTORE_AND_JUMP
        .size   objc_msgSend, .-objc_msgSend

        .globl  objc_msgSend_stret
        .type   objc_msgSend_stret, @function
objc_msgSend_stret:
        SAVE_ARGUMENTS
        movq    %rsi, %rdi              /* rdi holds the return slot: the receiver is in rsi, the selector in rdx */
        movq    %rdx, %rsi
        call    objc_msg_lookup@PLT
        RESTORE_AND_JUMP
        .size   objc_msgSend_stret, .-objc_msgSend_stret

        .section .note.GNU-stack,"",@progbits
