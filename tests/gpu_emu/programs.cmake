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

# The epoch's convolution plans, made in setup and reported by RD_CONV_REPORT=1
# (tests/gpu_emu/conv_plans_emu.sh).
if(TARGET resnet_ddp_emu AND TARGET resnet_ddp)
  foreach(precision fp32 fp16)
    add_test(NAME gpu_emu_conv_plans_${precision}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/conv_plans_emu.sh $<TARGET_FILE:resnet_ddp_emu>
                     $<TARGET_FILE:resnet_ddp> ${precision})
    set_tests_properties(gpu_emu_conv_plans_${precision} PROPERTIES LABELS "gpu_emu;e2e" TIMEOUT 600)
  endforeach()
endif()

# The CUDA backend's per-step costs on the emulator's counters (RD_EMU_STATS):
# tests/gpu_emu/backend_budget_emu.sh.
if(TARGET resnet_ddp_emu AND TARGET resnet_ddp)
  foreach(case model_ema one_rank planned)
    add_test(NAME gpu_emu_backend_budget_${case}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/backend_budget_emu.sh $<TARGET_FILE:resnet_ddp_emu>
                     $<TARGET_FILE:resnet_ddp> ${case})
    set_tests_properties(gpu_emu_backend_budget_${case} PROPERTIES LABELS "gpu_emu;e2e" TIMEOUT 600)
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

# --cuda-graphs: replayed forward and backward graphs against the eager run, bit for bit
# (tests/gpu_emu/graphs_emu.sh).
if(TARGET resnet_ddp_emu AND TARGET resnet_ddp)
  foreach(case fp32 fp16_overflow accum_ema_bf16 mixing adamw_segments syncbn_2ranks fp16_overflow_2ranks)
    add_test(NAME gpu_emu_graphs_${case}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/graphs_emu.sh $<TARGET_FILE:resnet_ddp_emu>
                     $<TARGET_FILE:resnet_ddp> ${RD_MPIEXEC} ${case})
    set_tests_properties(gpu_emu_graphs_${case} PROPERTIES LABELS "gpu_emu;e2e" TIMEOUT 900)
  endforeach()
endif()
