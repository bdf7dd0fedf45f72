/* grpc_service_impl.h - the methods of inference.GRPCInferenceService,
 * shared by the two halves of the service:
 *   grpc_request.c  each call's message as its HTTP/1.1 request to /v2;
 *   grpc_service.c  the method table's lookups, and the HTTP answer as
 *                   the method's response message and gRPC status. */
#ifndef CANOPY_SERVER_GRPC_SERVICE_IMPL_H
#define CANOPY_SERVER_GRPC_SERVICE_IMPL_H

#include "grpc_service.pb-c.h"

enum {
  M_SERVER_LIVE,
  M_SERVER_READY,
  M_MODEL_READY,
  M_SERVER_METADATA,
  M_MODEL_METADATA,
  M_MODEL_INFER,
  M_MODEL_CONFIG,
  M_MODEL_STATISTICS,
  M_REPOSITORY_INDEX,
  M_REPOSITORY_LOAD,
  M_REPOSITORY_UNLOAD,
  M_COUNT
};

/* Each method: its name, request and response messages. */
static const struct {
  const char *name;
  const ProtobufCMessageDescriptor *req, *resp;
} methods[M_COUNT] = {
    {"ServerLive", &inference__server_live_request__descriptor,
     &inference__server_live_response__descriptor},
    {"ServerReady", &inference__server_ready_request__descriptor,
     &inference__server_ready_response__descriptor},
    {"ModelReady", &inference__model_ready_request__descriptor,
     &inference__model_ready_response__descriptor},
    {"ServerMetadata", &inference__server_metadata_request__descriptor,
     &inference__server_metadata_response__descriptor},
    {"ModelMetadata", &inference__model_metadata_request__descriptor,
     &inference__model_metadata_response__descriptor},
    {"ModelInfer", &inference__model_infer_request__descriptor,
     &inference__model_infer_response__descriptor},
    {"ModelConfig", &inference__model_config_request__descriptor,
     &inference__model_config_response__descriptor},
    {"ModelStatistics", &inference__model_statistics_request__descriptor,
     &inference__model_statistics_response__descriptor},
    {"RepositoryIndex", &inference__repository_index_request__descriptor,
     &inference__repository_index_response__descriptor},
    {"RepositoryModelLoad",
     &inference__repository_model_load_request__descriptor,
     &inference__repository_model_load_response__descriptor},
    {"RepositoryModelUnload",
     &inference__repository_model_unload_request__descriptor,
     &inference__repository_model_unload_response__descriptor},
};

#define SERVICE_PREFIX "/inference.GRPCInferenceService/"

#endif
