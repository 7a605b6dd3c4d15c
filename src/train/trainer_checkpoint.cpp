// Every checkpoint read and write of a training run: the resume plan (rank 0 reads the
// metadata, plan_resume decides, the plan is broadcast as one value), loading the start
// weights and optimizer state, saving last.h5 / best_model.h5, and reloading the best
// model for the final evaluation.
#include <filesystem>

#include "train/trainer.h"

namespace fs = std::filesystem;

namespace rd::train {

// Decided on rank 0 before the model exists (plan_resume): which checkpoint a resume
// reads, the model-defining flags it fixes, every other flag that differs from the
// checkpoint's run, and where training continues. Every rank then takes the plan.
void Trainer::resolve_resume() {
  plan_ = plan_fresh(o_);
  agree(
      [&] {
        const std::string path = o_.resume_checkpoint();
        if (path.empty()) return;
        std::unique_ptr<io::CheckpointReader> reader;
        try {
          reader = std::make_unique<io::CheckpointReader>(path, o_.eval_only);
        } catch (const UsageError& e) {
          // Not HDF5, not a checkpoint, damaged: the way out of an unreadable last.h5.
          if (o_.eval_only) throw;
          throw UsageError(e.what() + std::string(kStartFresh));
        }
        const io::CheckpointMeta& m = reader->meta();
        plan_ = plan_resume(o_, path, m, {backend_->device() == DeviceKind::CUDA, env_.world});
        if (!plan_.model_settings.empty()) say(plan_.model_settings);
        if (!o_.eval_only) refuse_new_experiment(o_, path, m, plan_.differences);
      },
      rank0());
  std::string bytes = rank0() ? plan_.encode() : std::string();
  int64_t n = static_cast<int64_t>(bytes.size());
  ctrl_->broadcast(&n, sizeof n, 0);
  bytes.resize(static_cast<size_t>(n));
  ctrl_->broadcast(bytes.data(), bytes.size(), 0);
  plan_ = ResumePlan::decode(bytes);
  plan_.model.apply_to(o_);
  state_ = plan_.state;
}

// Rank 0 reads the start weights (a resumed checkpoint with its optimizer state, or
// --init weights); then every rank takes them and the plan's state.
void Trainer::load_start_state() {
  last_path_ = (fs::path(o_.output_dir) / "last.h5").string();
  best_path_ = (fs::path(o_.output_dir) / "best_model.h5").string();
  agree(
      [&] {
        if (plan_.resumed) {
          load_checkpoint();
        } else if (!o_.init.empty()) {
          if (o_.eval_only && run_.ema)
            throw UsageError("--model-ema --eval-only: evaluates a checkpoint's weight EMA, and --init " + o_.init +
                             " holds weights only; pass --resume CHECKPOINT, or leave out --model-ema");
          load_init();
        } else if (o_.eval_only) {
          throw UsageError("--eval-only: no checkpoint found (" + last_path_ + " does not exist)");
        }
      },
      rank0());
  broadcast_weights();
  apply_start_state();
  if (plan_.resumed) checkpoint_saved(plan_.checkpoint, state_.epoch, state_.step_in_epoch);
  args_history_.push_back(o_.command_line);
}

void Trainer::load_checkpoint() {
  const std::string& path = plan_.checkpoint;
  try {
    // Streamed into the arenas: no host copy of the weights and optimizer state.
    io::CheckpointReader ck(path, false);
    const io::CheckpointMeta& m = ck.meta();
    io::check_compatible(m, *run_.model, run_.class_names, path);
    ck.load_model(*run_.model, false);
    if (plan_.state.has_optimizer_state) ck.load_optimizer(*run_.model, run_.opt->export_state());
    if (run_.ema && plan_.state.has_ema_state) ck.load_ema(*run_.model, run_.ema->export_state());
    args_history_ = m.args_history.empty() && !m.args.empty() ? std::vector<std::string>{m.args} : m.args_history;
  } catch (const UsageError& e) {
    // A checkpoint that does not fit this run (classes, tensors, optimizer state).
    throw UsageError(e.what() + std::string(kStartFresh));
  }
}

void Trainer::load_init() {
  io::CheckpointReader ck(o_.init, true, init_weights(o_));
  check_init(o_, ck.meta());
  auto skipped = ck.load_model(*run_.model, true);
  if (!skipped.empty())
    notice("--init: the head in " + o_.init + " does not fit " + std::to_string(run_.class_names.size()) +
           " classes / --head " + head_name(o_.head) + "; it keeps its fresh initialisation");
  if (const std::string w = init_warning(o_, ck.meta()); !w.empty()) say("Warning: " + w);
  say("Initialised weights from " + o_.init + (o_.init_ema ? " (its weight EMA, " + ck.weights_origin() + ")" : ""));
}

// Rank 0's weights everywhere (a fresh init too: one source of truth).
void Trainer::broadcast_weights() {
  int64_t nbt = run_.model->num_batches_tracked();
  ctrl_->broadcast(&nbt, sizeof nbt, 0);
  dist::broadcast_model(*grad_, run_.model->params(), run_.model->buffers());
  run_.model->set_num_batches_tracked(nbt);
}

// The plan's optimizer and scheduler state on every rank (rank 0 read the tensors).
void Trainer::apply_start_state() {
  if (state_.has_optimizer_state) {
    for (size_t k = 0; k < run_.opt->state_count(); ++k) grad_->broadcast(run_.opt->state(k), run_.model->params().bytes(), 0);
    io::OptimizerState os = run_.opt->export_state();
    os.step = state_.optimizer_steps;
    os.lr = state_.lr;
    run_.opt->import_state(os);
  }
  if (run_.ema)
    run_.ema->start(*run_.model, *grad_, state_.has_ema_state, state_.ema_n_averaged, state_.ema_num_batches_tracked);
  if (state_.has_scheduler_state) {
    io::SchedulerState ss = run_.sched->export_state();
    ss.last_epoch = state_.scheduler_last_epoch;
    ss.plateau = state_.plateau;
    ss.cosine = state_.cosine;
    run_.sched->import_state(ss);
  }
  for (const auto& line : plan_.start_lines) say(line);
}

io::CheckpointMeta Trainer::base_meta() const {
  io::CheckpointMeta m;
  m.arch = name_of(arch_names(), o_.arch);
  m.head = head_name(o_.head);
  m.num_classes = static_cast<int64_t>(run_.class_names.size());
  m.image_size = o_.image_size;
  m.val_resize_size = o_.val_resize_size;
  m.val_crop_size = o_.val_crop_size;
  m.world_size = env_.world;
  m.batch_size = o_.batch_size;
  m.accum_steps = o_.accum_steps;
  m.seed = o_.seed;
  m.args = o_.command_line;
  m.args_history = args_history_;
  m.created_by = std::string("resnet_ddp ") + RESNET_DDP_VERSION;
  m.normalize = name_of(normalize_names(), o_.normalize);
  m.class_names = run_.class_names;
  record_slurm_job(m);
  return m;
}

void Trainer::save(const std::string& path, int64_t epoch, int64_t step_in_epoch, double val_loss, double val_acc,
                   double partial_loss, int64_t partial_correct, int64_t partial_count) {
  // best_model.h5 is for using the model: the weights only (Adam's state would triple
  // it); training resumes from last.h5, which keeps the optimizer and scheduler state.
  const bool weights_only = path == best_path_;
  agree(
      [&] {
        io::CheckpointMeta m = base_meta();
        // The run's position, at the point this file stands for.
        static_cast<io::RunPosition&>(m) = state_;
        m.epoch = epoch;
        m.step_in_epoch = step_in_epoch;
        m.partial_loss_sum = partial_loss;
        m.partial_correct = partial_correct;
        m.partial_count = partial_count;
        m.val_acc = val_acc;
        m.val_loss = val_loss;
        const io::OptimizerState opt = run_.opt && !weights_only ? run_.opt->export_state() : io::OptimizerState{};
        const io::SchedulerState sched = run_.sched && !weights_only ? run_.sched->export_state() : io::SchedulerState{};
        const io::EmaState ema = run_.ema && !weights_only ? run_.ema->export_state() : io::EmaState{};
        io::write_checkpoint(path, *run_.model, weights_only || !run_.opt ? nullptr : &opt,
                             weights_only || !run_.sched ? nullptr : &sched, m,
                             ema.present ? &ema : nullptr);  // straight from the arenas
      },
      rank0());
  if (path == last_path_) checkpoint_saved(path, epoch, step_in_epoch);
}

void Trainer::evaluate_best() {
  int64_t have_best = 0;
  if (rank0()) {
    std::error_code ec;
    have_best = fs::exists(best_path_, ec) ? 1 : 0;
  }
  ctrl_->broadcast(&have_best, sizeof have_best, 0);
  if (!have_best) return;
  // Training is over: its loader threads and batches and the optimizer state go
  // before the evaluation, which needs only the model and the validation loader.
  run_.train_loader.reset();
  run_.opt.reset();
  // Weights only, straight into the arenas: a host copy of the file (weights and
  // Adam state, 3x the parameters) made this the peak of the whole run.
  agree(
      [&] {
        io::CheckpointReader ck(best_path_, false);
        io::check_compatible(ck.meta(), *run_.model, run_.class_names, best_path_);
        ck.load_model(*run_.model, false);
      },
      rank0());
  broadcast_weights();
  double loss = 0, acc = 0;
  validate(loss, acc);
  say("Best model (val loss: " + py_float(loss) + ", val accuracy: " + py_float(acc) + ") has been saved to " +
      fs::absolute(best_path_).string());
}

}  // namespace rd::train
