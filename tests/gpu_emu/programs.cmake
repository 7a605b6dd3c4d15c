# The programs on the emulated device (label gpu_emu): resnet_ddp --device cuda on 2
# ranks against the CPU backend's same run (tests/gpu_emu/train_emu.sh).
if(TARGET resnet_ddp_emu AND TARGET resnet_ddp)
  foreach(case fp32 fp16_overflow bf16 preempt_resume predict_export device_choice mixup_cutmix presets)
    add_test(NAME gpu_emu_train_${case}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/train_emu.sh $<TARGET_FILE:resnet_ddp_emu>
                     $<TARGET_FILE:resnet_ddp> ${RD_MPIEXEC} ${PROJECT_SOURCE_DIR} ${case})
    set_tests_properties(gpu_emu_train_${case} PROPERTIES LABELS "gpu_emu;e2e" TIMEOUT 900)
  endforeach()
endif()

# What one steady-state training step asks of the device (RD_EMU_STATS): host waits,
# allocations, cuDNN Finds, NCCL calls per step, 1 and 2 ranks (tests/gpu_emu/step_budget.sh).
if(TARGET resnet_ddp_emu AND TARGET resnet_ddp)
  add_test(NAME gpu_emu_step_budget
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/step_budget.sh $<TARGET_FILE:resnet_ddp_emu>
                   $<TARGET_FILE:resnet_ddp> ${RD_MPIEXEC})
  set_tests_properties(gpu_emu_step_budget PROPERTIES LABELS "gpu_emu;e2e" TIMEOUT 900)
endif()
