// InProcessServer: LoadFromOptions -> Engine -> OpenAIServer on a free loopback port.
#include "apps/in_process_server.h"

#include <ctime>
#include <thread>

#include "engine/engine.h"
#include "server/http_server.h"
#include "server/template_renderer.h"
#include "tokenizer/tokenizer.h"

namespace dh::app {

struct InProcessServer::Impl {
  LoadedModel load;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<server::ChatPromptRenderer> renderer;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::OpenAIServer> http;
  std::thread http_thread;
  bool running = false;
};

Result<std::unique_ptr<InProcessServer>> InProcessServer::Start(const ModelOptions& options,
                                                                const std::string& served_name,
                                                                int max_num_seqs,
                                                                int http_threads) {
  std::unique_ptr<InProcessServer> s(new InProcessServer());
  s->impl_ = std::make_unique<Impl>();
  Impl& m = *s->impl_;
  DH_ASSIGN_OR_RETURN(m.load, LoadFromOptions(options));
  auto tokenizer = Tokenizer::Load(options.model_path);
  if (!tokenizer.ok()) return tokenizer.status().WithContext(options.model_path);
  m.tokenizer = std::move(*tokenizer);
  DH_ASSIGN_OR_RETURN(m.renderer, server::LoadChatRenderer(options.model_path, ""));
  EngineOptions eo;
  eo.max_num_seqs = max_num_seqs;
  m.engine = std::make_unique<Engine>(eo, std::move(m.load.model), *m.load.backend,
                                      m.tokenizer.get());
  DH_RETURN_IF_ERROR(m.engine->Start());
  server::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.served_model_names = {served_name};
  so.http_threads = http_threads;
  m.http = std::make_unique<server::OpenAIServer>(so);
  if (Status st = m.http->Bind(); !st.ok()) {
    m.engine->Stop();
    return st;
  }
  m.http_thread = std::thread([&m] { m.http->Run(); });
  m.running = true;
  server::ServingContext ctx;
  ctx.engine = m.engine.get();
  ctx.tokenizer = m.tokenizer.get();
  ctx.chat_renderer = m.renderer.get();
  ctx.model_load_seconds = m.load.load_seconds;
  ctx.model_created_unix = std::time(nullptr);
  m.http->Attach(ctx);
  return s;
}

std::string InProcessServer::url() const {
  return "http://127.0.0.1:" + std::to_string(impl_->http->port());
}

void InProcessServer::Stop() {
  if (!impl_ || !impl_->running) return;
  impl_->running = false;
  impl_->engine->Stop();
  impl_->http->Stop();
  impl_->http_thread.join();
}

InProcessServer::~InProcessServer() { Stop(); }

}  // namespace dh::app
